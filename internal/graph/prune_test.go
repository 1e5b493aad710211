package graph_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
)

const (
	sessA = "aaaaaaaa-0000-4000-8000-000000000001"
	sessB = "bbbbbbbb-0000-4000-8000-000000000002"
	sessC = "cccccccc-0000-4000-8000-000000000003"
)

// hostileFacts name entities with quotes, backslashes, unicode and Cypher
// fragments. Session A's entities Bob and Ünïcødé are also named by B and C.
var hostileFacts = []fixture.GraphFact{
	{ID: 1, SessionID: sessA, Entities: fixture.Entities(`Alice met Bob at O"Brien's`)},
	{ID: 2, SessionID: sessA, Entities: fixture.Entities(`Robert'}) DETACH DELETE n // and Ünïcødé near Back\slash Unprov`)},
	{ID: 3, SessionID: sessB, Entities: fixture.Entities("Bob likes Carol")},
	{ID: 4, SessionID: sessC, Entities: fixture.Entities("Dave\tknows Ünïcødé")},
}

func TestPruneRemovesOnlyWhatTheErasedSessionsAlone(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := fixture.WriteGraph(ctx, g, hostileFacts); err != nil {
		t.Fatal(err)
	}
	// A relationship without provenance attests nothing: Unprov, named by
	// session A alone, goes with it; Carol, named by B, stays.
	if _, err := g.Query(ctx, "MATCH (a:Entity {key: 'unprov'}), (b:Entity {key: 'carol'}) CREATE (a)-[:RELATES]->(b)", nil); err != nil {
		t.Fatal(err)
	}

	var written []string
	for _, f := range hostileFacts {
		written = append(written, f.Entities...)
	}
	if got, want := entityNames(t, g), uniq(written); !slices.Equal(got, want) {
		t.Fatalf("entity names did not round-trip:\n got %q\nwant %q", got, want)
	}

	before := elementsOf(t, ctx, g)
	doomed := []string{"alice", `o"brien's`, "robert'})", "detach", "delete", `back\slash`, "unprov"}
	want := snapshot{}
	for k, v := range before {
		if strings.Contains(k, sessA) || slices.ContainsFunc(doomed, func(d string) bool { return strings.HasPrefix(k, "Entity "+d+" ") }) ||
			k == "RELATES   unprov>carol" {
			continue
		}
		want[k] = v
	}
	if len(want) == len(before) {
		t.Fatal("the fixture holds nothing of session A")
	}

	removed, err := g.Prune(ctx, []string{sessA}, 2) // tiny batches: every delete loops
	if err != nil {
		t.Fatal(err)
	}
	if after := elementsOf(t, ctx, g); !maps.Equal(after, want) {
		t.Fatalf("after the prune\n got %v\nwant %v", after, want)
	}
	wantNodes := map[string]int64{"Entity": 7, "Fact": 2, "Session": 1}
	wantRels := map[string]int64{"FROM": 2, "MENTIONS": 9, "RELATES": 7, graph.AttachedKey: 1}
	if !maps.Equal(removed.Nodes, wantNodes) || !maps.Equal(removed.Relationships, wantRels) {
		t.Fatalf("removed %v / %v, want %v / %v", removed.Nodes, removed.Relationships, wantNodes, wantRels)
	}

	left, err := g.Count(ctx, []string{sessA})
	if err != nil {
		t.Fatal(err)
	}
	if left.Total() != 0 {
		t.Fatalf("after the prune the graph still holds %v / %v of session A", left.Nodes, left.Relationships)
	}
	again, err := g.Prune(ctx, []string{sessA}, 2)
	if err != nil || again.Total() != 0 {
		t.Fatalf("a repeated prune removed %v / %v (err %v)", again.Nodes, again.Relationships, err)
	}
}

func TestPruneRefusesIDsThatAreNotSessionIDs(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := fixture.WriteGraph(ctx, g, hostileFacts); err != nil {
		t.Fatal(err)
	}
	before := elementsOf(t, ctx, g)
	for _, ids := range [][]string{{`"] OR 1=1 //`}, {strings.ToUpper(sessA)}, {sessA, "x"}} {
		if _, err := g.Prune(ctx, ids, 10); err == nil {
			t.Errorf("%q: accepted", ids)
		}
	}
	if after := elementsOf(t, ctx, g); !maps.Equal(after, before) {
		t.Fatal("a refused prune changed the graph")
	}
}

func TestPruneFailsWhenFalkorDBIsDown(t *testing.T) {
	c, err := graph.Open("falkor://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Graph("memory").Prune(testCtx(t), []string{sessA}, 10); err == nil {
		t.Fatal("a prune against a closed port succeeded")
	}
}

func entityNames(t *testing.T, g *graph.Graph) []string {
	t.Helper()
	res, err := g.ReadQuery(testCtx(t), "MATCH (e:Entity) RETURN e.name", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for res.Next() {
		v, err := res.Record().GetByIndex(0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v.(string))
	}
	slices.Sort(out)
	return out
}

func uniq(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if !seen[fixture.EntityKey(n)] {
			seen[fixture.EntityKey(n)] = true
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// FalkorDB 4.16.3 left a deleted node in label scans when its label still had
// pending additions from a bulk write (see syncLabels); every later read of
// the label failed. The sizes are those at which it reproduced.
func TestPruneAfterABulkWriteLeavesTheLabelReadable(t *testing.T) {
	ctx := testCtx(t)
	_, ids, g := bulkGraph(t, "bulk", 3000, 8, 20000)
	if _, err := g.Prune(ctx, ids[:1], 1000); err != nil {
		t.Fatal(err)
	}
	res, err := g.ReadQuery(ctx, "MATCH (x:Session) RETURN count(x.id)", nil)
	if err != nil {
		t.Fatalf("the Session label is unreadable after a prune: %v", err)
	}
	res.Next()
	if n, _ := res.Record().GetByIndex(0); n != int64(len(ids)-1) {
		t.Fatalf("%v sessions readable, want %d", n, len(ids)-1)
	}
}

func TestAGraphThatDoesNotExistHasNothingToPrune(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := g.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() (graph.Counts, error){
		"prune": func() (graph.Counts, error) { return g.Prune(ctx, []string{sessA}, 10) },
		"count": func() (graph.Counts, error) { return g.Count(ctx, []string{sessA}) },
	} {
		if c, err := f(); err != nil || c.Total() != 0 {
			t.Errorf("%s on a missing graph: %v / %v (err %v)", name, c.Nodes, c.Relationships, err)
		}
	}
}

// Two prunes of sessions that share an entity, run at once: each sees the
// other's relationship and keeps the entity, so without a second look after
// the relationships go, the entity would be left with none. Forty pairs at
// once; no entity may be left unattached.
func TestConcurrentPrunesOfSessionsSharingAnEntityLeaveNoOrphan(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	const pairs = 40
	var facts []fixture.GraphFact
	id := func(pair, side int) string { return fmt.Sprintf("%08d-0000-4000-8000-%012d", pair, side) }
	for i := 0; i < pairs; i++ {
		shared := fmt.Sprintf("Shared%d", i)
		facts = append(facts,
			fixture.GraphFact{ID: int64(2 * i), SessionID: id(i, 0), Entities: []string{shared, "Keeper"}},
			fixture.GraphFact{ID: int64(2*i + 1), SessionID: id(i, 1), Entities: []string{shared}})
	}
	facts = append(facts, fixture.GraphFact{ID: 10_000, SessionID: id(999, 0), Entities: []string{"Keeper"}})
	if err := fixture.WriteGraph(ctx, g, facts); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*pairs)
	for i := 0; i < pairs; i++ {
		for side := 0; side < 2; side++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := g.Prune(ctx, []string{id(i, side)}, 2); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	res, err := g.ReadQuery(ctx, "MATCH (e:Entity) OPTIONAL MATCH (e)-[q]-() WITH e, count(q) AS rels RETURN e.key, rels ORDER BY e.key", nil)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for res.Next() {
		r := res.Record()
		k, _ := r.GetByIndex(0)
		n, _ := r.GetByIndex(1)
		left = append(left, fmt.Sprintf("%v:%v", k, n))
	}
	// Only Keeper stays: the session outside the pairs still names it.
	if !slices.Equal(left, []string{"keeper:1"}) {
		t.Errorf("entities left (key:relationships): %v, want only keeper:1", left)
	}
}

// provenanceFacts: session A (erased) names Xavier, Carol and Walt; B names
// Carol and Yolanda.
var provenanceFacts = []fixture.GraphFact{
	{ID: 1, SessionID: sessA, Entities: []string{"Xavier", "Carol", "Walt"}},
	{ID: 2, SessionID: sessB, Entities: []string{"Carol", "Yolanda"}},
}

// plantWithoutProvenance adds relationships without session_id or fact_id
// (and one with a fact_id only) around provenanceFacts.
func plantWithoutProvenance(t *testing.T, g *graph.Graph) {
	t.Helper()
	for _, q := range []string{
		// From an entity only A attests, to a live one and to one nothing else holds.
		"MATCH (x:Entity {key: 'xavier'}), (y:Entity {key: 'yolanda'}) CREATE (x)-[:RELATES]->(y), (:Entity {key: 'nina', name: 'Nina'})-[:KNOWS]->(x)",
		// From A's fact to an entity nothing else holds, and to one also
		// attached (without provenance) to a live entity.
		"MATCH (f:Fact {id: 1}), (y:Entity {key: 'yolanda'}) CREATE (f)-[:MENTIONS]->(:Entity {key: 'zora', name: 'Zora'}), (f)-[:MENTIONS]->(:Entity {key: 'olga', name: 'Olga'})-[:RELATES]->(y)",
		// Between two live entities.
		"MATCH (c:Entity {key: 'carol'}), (y:Entity {key: 'yolanda'}) CREATE (c)-[:RELATES]->(y)",
		// A fact_id without session_id is provenance: the sweep checks it.
		"MATCH (w:Entity {key: 'walt'}), (y:Entity {key: 'yolanda'}) CREATE (w)-[:RELATES {fact_id: 77}]->(y)",
	} {
		if _, err := g.Query(testCtx(t), q, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func TestARelationshipWithoutProvenanceKeepsNoErasedEntity(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := fixture.WriteGraph(ctx, g, provenanceFacts); err != nil {
		t.Fatal(err)
	}
	plantWithoutProvenance(t, g)
	before := elementsOf(t, ctx, g)
	// The plan's count sees Xavier as A's alone (Carol has B, Walt its fact_id).
	if found, err := g.Count(ctx, []string{sessA}); err != nil || found.Nodes["Entity"] == 0 {
		t.Fatalf("before the prune, Count finds %v entities only A attests (err %v), want Xavier", found.Nodes["Entity"], err)
	}

	removed, err := g.Prune(ctx, []string{sessA}, 1) // batches of one: every delete loops
	if err != nil {
		t.Fatal(err)
	}
	// Xavier (A alone; its relationships without provenance do not keep it)
	// goes, and Nina and Zora, which only relationships without provenance
	// held to erased elements, are left with nothing and go too. Carol and
	// Yolanda (named by B), Walt (a fact_id of its own) and Olga (still
	// attached to Yolanda) stay.
	if got, want := entityKeys(t, g), []string{"carol", "olga", "walt", "yolanda"}; !slices.Equal(got, want) {
		t.Fatalf("entities after the prune: %q, want %q", got, want)
	}
	gone := func(k string) bool {
		return strings.Contains(k, sessA) || strings.Contains(k, "xavier") || strings.Contains(k, "nina") ||
			strings.Contains(k, "zora") || strings.HasPrefix(k, "MENTIONS   1>")
	}
	want := snapshot{}
	for k, v := range before {
		if !gone(k) {
			want[k] = v
		}
	}
	if after := elementsOf(t, ctx, g); !maps.Equal(after, want) {
		t.Fatalf("after the prune\n got %v\nwant %v", after, want)
	}
	// Relationships without provenance: Xavier's two, and A's fact's two.
	wantNodes := map[string]int64{"Entity": 3, "Fact": 1, "Session": 1}
	wantRels := map[string]int64{"FROM": 1, "MENTIONS": 3, "RELATES": 2, graph.AttachedKey: 4}
	if !maps.Equal(removed.Nodes, wantNodes) || !maps.Equal(removed.Relationships, wantRels) {
		t.Fatalf("removed %v / %v, want %v / %v", removed.Nodes, removed.Relationships, wantNodes, wantRels)
	}
	if left, err := g.Count(ctx, []string{sessA}); err != nil || left.Total() != 0 {
		t.Fatalf("after the prune the graph still holds %v / %v of session A (err %v)", left.Nodes, left.Relationships, err)
	}
	if again, err := g.Prune(ctx, []string{sessA}, 1); err != nil || again.Total() != 0 {
		t.Fatalf("a repeated prune removed %v / %v (err %v)", again.Nodes, again.Relationships, err)
	}
}

func entityKeys(t *testing.T, g *graph.Graph) []string {
	t.Helper()
	res, err := g.ReadQuery(testCtx(t), "MATCH (e:Entity) RETURN e.key ORDER BY e.key", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for res.Next() {
		v, err := res.Record().GetByIndex(0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v.(string))
	}
	return out
}
