package graph_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
)

var errCut = errors.New("test: connection cut")

// cutAfter passes the first left commands to FalkorDB, in pipelines or
// alone, and fails every later one without sending it: the client dies
// between two queries, wherever that is.
type cutAfter struct {
	redis.UniversalClient
	left *int
}

func (c cutAfter) Do(ctx context.Context, args ...any) *redis.Cmd {
	if *c.left <= 0 {
		cmd := redis.NewCmd(ctx, args...)
		cmd.SetErr(errCut)
		return cmd
	}
	*c.left--
	return c.UniversalClient.Do(ctx, args...)
}

func (c cutAfter) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	return c.UniversalClient.Pipelined(ctx, func(p redis.Pipeliner) error { return fn(cutPipe{p, c.left}) })
}

type cutPipe struct {
	redis.Pipeliner
	left *int
}

func (c cutPipe) Do(ctx context.Context, args ...any) *redis.Cmd {
	if *c.left <= 0 {
		cmd := redis.NewCmd(ctx, args...)
		cmd.SetErr(errCut)
		return cmd
	}
	*c.left--
	return c.Pipeliner.Do(ctx, args...)
}

// A prune cut off after any number of queries (inside a pipeline too) and
// then repeated ends in the state of a prune never cut off, once the
// entities left with no relationship at all are removed as the sweep does
// (the far ends of relationships without provenance a cut prune deleted are
// known only to it). Small batches, so that every delete loops.
func TestPruneCutAnywhereAndRepeatedEndsInTheSameState(t *testing.T) {
	ctx := testCtx(t)
	// Both fixtures in one graph (fact IDs moved apart), with relationships
	// without provenance around session A's.
	facts := append([]fixture.GraphFact{}, hostileFacts...)
	for _, f := range provenanceFacts {
		f.ID += 100
		facts = append(facts, f)
	}
	build := func() *graph.Graph {
		g := freshGraph(t)
		if err := fixture.WriteGraph(ctx, g, facts); err != nil {
			t.Fatal(err)
		}
		plantWithoutProvenance(t, g)
		return g
	}
	sweepBare := func(g *graph.Graph) snapshot {
		if _, err := g.Query(ctx, "MATCH (e:Entity) WHERE NOT (e)--() DELETE e", nil); err != nil {
			t.Fatal(err)
		}
		return elementsOf(t, ctx, g)
	}
	ref := build()
	if _, err := ref.Prune(ctx, []string{sessA}, 2); err != nil {
		t.Fatal(err)
	}
	want := sweepBare(ref)

	for cut := 0; ; cut++ {
		g := build()
		c, err := graph.Open(fdb.URL())
		if err != nil {
			t.Fatal(err)
		}
		left := cut
		graph.WrapConn(c, func(u redis.UniversalClient) redis.UniversalClient { return cutAfter{u, &left} })
		_, err = c.Graph(g.Name()).Prune(ctx, []string{sessA}, 2)
		_ = c.Close()
		if err == nil {
			if cut < 5 {
				t.Fatalf("a prune of %d queries at most", cut)
			}
			t.Logf("cut after each of the prune's %d queries", cut)
			return // every cut was tried
		}
		if !errors.Is(err, errCut) {
			t.Fatalf("cut after %d queries: %v", cut, err)
		}
		if _, err := g.Prune(ctx, []string{sessA}, 2); err != nil {
			t.Fatalf("cut after %d queries, the repeat: %v", cut, err)
		}
		if got := sweepBare(g); !maps.Equal(got, want) {
			t.Fatalf("cut after %d queries, then repeated:\n got %v\nwant %v", cut, got, want)
		}
	}
}

// The sessions' relationships, their nodes and the left entities go in one
// pipeline, sent again while any of its queries deleted a full batch: here
// no relationship type reaches the batch size, but the entities left bare
// by the fact's deletion (four, held to it by relationships without
// provenance) take two batches of three.
func TestPruneRepeatsThePipelineUntilEveryQueryIsDone(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := fixture.WriteGraph(ctx, g, []fixture.GraphFact{
		{ID: 1, SessionID: sessA, Entities: []string{"Xena", "Yves"}},
		{ID: 2, SessionID: sessB, Entities: []string{"Yves", "Will"}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Query(ctx, "MATCH (f:Fact {id: 1}) UNWIND ['z1', 'z2', 'z3', 'z4'] AS k CREATE (f)-[:MENTIONS]->(:Entity {key: k, name: k})", nil); err != nil {
		t.Fatal(err)
	}
	before := elementsOf(t, ctx, g)
	want := snapshot{}
	for k, v := range before {
		if !strings.Contains(k, sessA) && !strings.HasPrefix(k, "Entity xena ") && !strings.HasPrefix(k, "Entity z") && !strings.HasPrefix(k, "MENTIONS   1>") {
			want[k] = v
		}
	}
	removed, err := g.Prune(ctx, []string{sessA}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if after := elementsOf(t, ctx, g); !maps.Equal(after, want) {
		t.Fatalf("after the prune\n got %v\nwant %v", after, want)
	}
	wantNodes := map[string]int64{"Entity": 5, "Fact": 1, "Session": 1}
	wantRels := map[string]int64{"FROM": 1, "MENTIONS": 2, "RELATES": 1, graph.AttachedKey: 4}
	if !maps.Equal(removed.Nodes, wantNodes) || !maps.Equal(removed.Relationships, wantRels) {
		t.Fatalf("removed %v / %v, want %v / %v", removed.Nodes, removed.Relationships, wantNodes, wantRels)
	}
	if left, err := g.Count(ctx, []string{sessA}); err != nil || left.Total() != 0 {
		t.Fatalf("after the prune the graph still holds %v / %v of session A (err %v)", left.Nodes, left.Relationships, err)
	}
}

// Count finds each relationship type, each session label and the
// entities only the sessions attest (once per pattern that reaches them,
// as it always counted), and a zero for each when nothing is left.
func TestCountFindsEachTypeAndLabelOfTheSessions(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := fixture.WriteGraph(ctx, g, []fixture.GraphFact{
		{ID: 1, SessionID: sessA, Entities: []string{"Xena", "Yves", "Zack"}},
		{ID: 2, SessionID: sessA, Entities: []string{"Zack"}},
		{ID: 3, SessionID: sessB, Entities: []string{"Yves"}},
	}); err != nil {
		t.Fatal(err)
	}
	// Xena and Zack are A's alone: Xena is reached by MENTIONS and as a
	// RELATES source, Zack by MENTIONS and as a RELATES target.
	found, err := g.Count(ctx, []string{sessA, sessC})
	if err != nil {
		t.Fatal(err)
	}
	wantNodes := map[string]int64{"Entity": 4, "Fact": 2, "Session": 1}
	wantRels := map[string]int64{"FROM": 2, "MENTIONS": 4, "RELATES": 2}
	if !maps.Equal(found.Nodes, wantNodes) || !maps.Equal(found.Relationships, wantRels) {
		t.Fatalf("found %v / %v, want %v / %v", found.Nodes, found.Relationships, wantNodes, wantRels)
	}
	none, err := g.Count(ctx, []string{sessC})
	if err != nil {
		t.Fatal(err)
	}
	zeros := map[string]int64{"Entity": 0, "Fact": 0, "Session": 0}
	if !maps.Equal(none.Nodes, zeros) || none.Total() != 0 || len(none.Relationships) != 3 {
		t.Fatalf("for a session with nothing, found %v / %v, want zeros for every label and type", none.Nodes, none.Relationships)
	}
}

// A server that runs a CALL subquery once over all its input rows (FalkorDB
// before 4.6.4) would let each attestation check see one entity: the
// prune refuses it, before deleting anything, and the count too.
func TestAServerRunningSubqueriesOnceForAllRowsIsRefused(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := fixture.WriteGraph(ctx, g, []fixture.GraphFact{
		{ID: 1, SessionID: sessA, Entities: []string{"Xena", "Yves"}},
		{ID: 2, SessionID: sessB, Entities: []string{"Yves"}},
	}); err != nil {
		t.Fatal(err)
	}
	before := elementsOf(t, ctx, g)
	restore := graph.SetSubqueryCheck("UNWIND [1, 2] AS x WITH x LIMIT 1 RETURN count(x)")
	defer restore()
	if _, err := g.Prune(ctx, []string{sessA}, 10); err == nil || !strings.Contains(err.Error(), "once over all its input rows") {
		t.Fatalf("prune on a server running subqueries once for all rows: %v, want it refused", err)
	}
	if _, err := g.Count(ctx, []string{sessA}); err == nil {
		t.Fatal("count on a server running subqueries once for all rows: no error, want it refused")
	}
	if after := elementsOf(t, ctx, g); !maps.Equal(before, after) {
		t.Fatalf("the refused prune changed the graph: %v, was %v", after, before)
	}
	restore()
	removed, err := g.Prune(ctx, []string{sessA}, 10)
	if err != nil || removed.Nodes["Entity"] != 1 {
		t.Fatalf("prune once the server passes the check: removed %v, %v; want Xena removed", removed.Nodes, err)
	}
}
