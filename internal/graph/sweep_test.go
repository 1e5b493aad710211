package graph_test

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
)

const orphanSession = "dddddddd-0000-4000-8000-000000000004"

func TestSweepRemovesPlantedOrphansAndKeepsEverythingWithSurvivingProvenance(t *testing.T) {
	ctx := testCtx(t)
	conn, ids, g := bulkGraph(t, "t1", 20, 4, 15)
	// One session is tombstoned: it still exists and keeps its graph.
	if _, err := conn.Exec(ctx, `UPDATE memory.sessions SET tombstoned_at = now(), tombstoned_by = 'x' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	derived := elementsOf(t, ctx, g)

	// Orphans: a session Postgres never had (a stale deriver wrote it after
	// an erasure), a fact deleted from a surviving session, an entity with
	// no relationship left.
	if err := fixture.WriteGraph(ctx, g, []fixture.GraphFact{{ID: 999001, SessionID: orphanSession, Entities: []string{"Zed", "E1"}}}); err != nil {
		t.Fatal(err)
	}
	var goneFact int64
	if err := conn.QueryRow(ctx, `DELETE FROM memory.facts WHERE id = (SELECT min(id) FROM memory.facts WHERE session_id = $1) RETURNING id`, ids[1]).Scan(&goneFact); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Query(ctx, "CREATE (:Entity {key: 'lonely', name: 'Lonely'})", nil); err != nil {
		t.Fatal(err)
	}
	want := snapshot{}
	for k, v := range derived {
		if !strings.Contains(k, " "+itoa(goneFact)+" ") {
			want[k] = v
		}
	}
	if len(want) == len(derived) {
		t.Fatal("the deleted fact has no element in the graph")
	}

	res, err := g.Sweep(ctx, postgres.GraphSource{Pool: conn, Schema: "memory"}, graph.SweepOptions{Limit: 3, Chunk: 7, MaxOrphanFraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	got := elementsOf(t, ctx, g)
	// Entities only the removed fact named go as well; compare the rest.
	for k := range want {
		if strings.HasPrefix(k, "Entity ") {
			if _, ok := got[k]; !ok && !entityHasOnlyFact(derived, k, goneFact) {
				t.Errorf("entity %q was removed though other facts name it", k)
			}
			delete(want, k)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "Entity ") {
			delete(got, k)
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("after the sweep\n got %v\nwant %v", got, want)
	}
	if res.OrphanSessions != 1 || res.OrphanFacts < 2 || res.SessionsChecked != 21 || res.ProvenancelessNodes+res.ProvenancelessRelationships != 0 {
		t.Fatalf("sweep result %+v", res)
	}
	if res.Removed.Nodes["Session"] != 1 || res.Removed.Nodes["Fact"] != 2 || res.Removed.Nodes["Entity"] < 2 {
		t.Fatalf("removed %v / %v", res.Removed.Nodes, res.Removed.Relationships)
	}
	for _, k := range []string{"zed", "lonely"} {
		if n := countEntity(t, g, k); n != 0 {
			t.Errorf("orphan entity %s survived", k)
		}
	}
	if n := countEntity(t, g, "e1"); n != 1 {
		t.Errorf("entity E1, named by surviving sessions, was removed")
	}

	again, err := g.Sweep(ctx, postgres.GraphSource{Pool: conn, Schema: "memory"}, graph.SweepOptions{MaxOrphanFraction: 0.5})
	if err != nil || again.Removed.Total() != 0 {
		t.Fatalf("a second sweep removed %v / %v (err %v)", again.Removed.Nodes, again.Removed.Relationships, err)
	}
}

// The sweep counts the elements without provenance, removes those only
// erased data held (an orphan session's, an orphan fact's) and keeps those
// attached to live data.
func TestSweepCountsElementsWithoutProvenanceAndRemovesThoseOnlyErasedDataHeld(t *testing.T) {
	ctx := testCtx(t)
	conn, ids, g := bulkGraph(t, "t2", 6, 3, 10)
	for _, k := range []string{"e1", "e2"} {
		if countEntity(t, g, k) != 1 {
			t.Fatalf("fixture: entity %s is not derived", k)
		}
	}
	base := elementsOf(t, ctx, g)

	// Orphans with relationships without provenance: session D (no row in
	// Postgres) names Zed, related to live E1, and its fact mentions Shadow;
	// fact 999002 (no row) of a live session names Ivy, related to E1.
	if err := fixture.WriteGraph(ctx, g, []fixture.GraphFact{
		{ID: 999001, SessionID: orphanSession, Entities: []string{"Zed"}},
		{ID: 999002, SessionID: ids[1], Entities: []string{"Ivy"}},
	}); err != nil {
		t.Fatal(err)
	}
	// Kept: attached to live data, they stay and are counted.
	kept := []string{"RELATES   e1>e2", "Entity legacy  Legacy", "RELATES   legacy>e1", "Fact manual  ", "FROM   manual>" + ids[2]}
	for _, q := range []string{
		"MATCH (z:Entity {key: 'zed'}), (e:Entity {key: 'e1'}) CREATE (z)-[:RELATES]->(e)",
		"MATCH (f:Fact {id: 999001}) CREATE (f)-[:MENTIONS]->(:Entity {key: 'shadow', name: 'Shadow'})",
		"MATCH (i:Entity {key: 'ivy'}), (e:Entity {key: 'e1'}) CREATE (i)-[:RELATES]->(e)",
		"MATCH (a:Entity {key: 'e1'}), (b:Entity {key: 'e2'}) CREATE (a)-[:RELATES]->(b)",
		"MATCH (e:Entity {key: 'e1'}) CREATE (:Entity {key: 'legacy', name: 'Legacy'})-[:RELATES]->(e)",
		"MATCH (s:Session {id: $s}) CREATE (:Fact {key: 'manual'})-[:FROM]->(s)",
	} {
		if _, err := g.Query(ctx, q, map[string]any{"s": ids[2]}); err != nil {
			t.Fatal(err)
		}
	}

	src := postgres.GraphSource{Pool: conn, Schema: "memory"}
	res, err := g.Sweep(ctx, src, graph.SweepOptions{Limit: 1, Chunk: 2, MaxOrphanFraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(base)
	for _, k := range kept {
		want[k]++
	}
	if got := elementsOf(t, ctx, g); !maps.Equal(got, want) {
		t.Fatalf("after the sweep, extra %v, missing %v", subtract(got, want), subtract(want, got))
	}
	if res.ProvenancelessNodes != 2 || res.ProvenancelessRelationships != 3 {
		t.Fatalf("the sweep counted %d nodes and %d relationships without provenance, want 2 (Legacy, the manual fact) and 3",
			res.ProvenancelessNodes, res.ProvenancelessRelationships)
	}
	// Zed's and Ivy's relationship to E1, and D's fact's to Shadow.
	if n := res.Removed.Relationships[graph.AttachedKey]; n != 3 {
		t.Errorf("removed %d relationships attached to erased nodes, want 3", n)
	}
	if res.Removed.Nodes["Entity"] != 3 || res.Removed.Nodes["Fact"] != 2 || res.Removed.Nodes["Session"] != 1 {
		t.Errorf("removed %v", res.Removed.Nodes)
	}

	again, err := g.Sweep(ctx, src, graph.SweepOptions{MaxOrphanFraction: 0.5})
	if err != nil || again.Removed.Total() != 0 || again.ProvenancelessNodes != 2 || again.ProvenancelessRelationships != 3 {
		t.Fatalf("a second sweep removed %v / %v and counted %d / %d without provenance (err %v)",
			again.Removed.Nodes, again.Removed.Relationships, again.ProvenancelessNodes, again.ProvenancelessRelationships, err)
	}
}

func TestSweepAgainstTheWrongDatabaseIsRefused(t *testing.T) {
	ctx := testCtx(t)
	g := freshGraph(t)
	if err := fixture.WriteGraph(ctx, g, hostileFacts); err != nil {
		t.Fatal(err)
	}
	empty, err := pg.MigratedDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, empty)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	before := elementsOf(t, ctx, g)
	_, err = g.Sweep(ctx, postgres.GraphSource{Pool: conn, Schema: "memory"}, graph.SweepOptions{MaxOrphanFraction: 0.5})
	if !errors.Is(err, graph.ErrSweepRefused) || !strings.Contains(err.Error(), "3 of 3 sessions") {
		t.Fatalf("sweep against an empty database: %v", err)
	}
	if after := elementsOf(t, ctx, g); !maps.Equal(after, before) {
		t.Fatal("a refused sweep changed the graph")
	}
}

// subtract lists the elements of a not in b (as many times as a has more).
func subtract(a, b snapshot) []string {
	var out []string
	for k, n := range a {
		for i := b[k]; i < n; i++ {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func entityHasOnlyFact(derived snapshot, entity string, fact int64) bool {
	key := strings.SplitN(strings.TrimPrefix(entity, "Entity "), " ", 2)[0]
	others := 0
	for k := range derived {
		if strings.HasPrefix(k, "MENTIONS ") && strings.HasSuffix(k, ">"+key) && !strings.Contains(k, " "+itoa(fact)+" ") {
			others++
		}
	}
	return others == 0
}

func countEntity(t *testing.T, g *graph.Graph, key string) int64 {
	t.Helper()
	res, err := g.ReadQuery(testCtx(t), "MATCH (e:Entity {key: $k}) RETURN count(e)", map[string]any{"k": key})
	if err != nil {
		t.Fatal(err)
	}
	res.Next()
	v, err := res.Record().GetByIndex(0)
	if err != nil {
		t.Fatal(err)
	}
	return v.(int64)
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }
