package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// graphEnv is a memoryEnv whose store has a FalkorDB graph derived from its facts.
type graphEnv struct {
	*memoryEnv
	g      *graph.Graph
	before map[string]int
}

// Entities of the facts: "Shared" is named by erasedA and keptB, "OnlyA" and
// "OnlyA2" by one erased session each, the content marker by both erased
// sessions, "Other" by tenant t2's session.
func newGraphEnv(t *testing.T, prefix, url string, plant func(context.Context, *graph.Graph)) *graphEnv {
	t.Helper()
	ctx := context.Background()
	ge := &graphEnv{}
	graphName := ""
	setup := func(e *memoryEnv) {
		for id, names := range map[string]string{erasedA: " Shared OnlyA", erasedA2: " OnlyA2", keptB: " Shared Kept", otherT2: " Other Shared"} {
			if _, err := e.conn.Exec(ctx, `UPDATE memory.facts SET content = content || $2 WHERE session_id = $1`, id, names); err != nil {
				t.Fatal(err)
			}
		}
		graphName = "g-" + e.ns
		c, err := graph.Open(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		ge.g = c.Graph(graphName)
		if err := fixture.DeriveGraph(ctx, e.conn, "memory", ge.g); err != nil {
			t.Fatal(err)
		}
		if ge.before, err = testenv.GraphElements(ctx, ge.g); err != nil {
			t.Fatal(err)
		}
		if plant != nil {
			plant(ctx, ge.g)
		}
		createSecret(t, e.ns, "falkor", map[string]string{"url": url})
	}
	ge.memoryEnv = newMemoryEnvWith(t, prefix, setup, func(s *lethev1.MemoryStore) {
		s.Spec.FalkorDB = &lethev1.FalkorDBSpec{URLSecretRef: lethev1.SecretKeyRef{Name: "falkor", Key: "url"}, Graph: graphName}
	})
	return ge
}

// wantAfterErasure is the graph before, less every element of the erased
// sessions and the entities only they named.
func (ge *graphEnv) wantAfterErasure() map[string]int {
	want := map[string]int{}
	for k, v := range ge.before {
		if strings.Contains(k, erasedA) || strings.Contains(k, erasedA2) {
			continue
		}
		if slices.ContainsFunc([]string{"onlya ", "onlya2 ", strings.ToLower(marker) + " "}, func(p string) bool { return strings.HasPrefix(k, "Entity "+p) }) {
			continue
		}
		want[k] = v
	}
	return want
}

func (ge *graphEnv) elements(t *testing.T) map[string]int {
	t.Helper()
	got, err := testenv.GraphElements(context.Background(), ge.g)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestGraphStepPrunesOnlyWhatTheErasedSessionsAlone(t *testing.T) {
	ge := newGraphEnv(t, "graph", fdb.URL(), nil)
	if _, ok := ge.before["Entity shared  Shared"]; !ok {
		t.Fatalf("fixture: no shared entity in %v", ge.before)
	}
	// Tenant t2's session is named too: it is not found for t1 and its graph stays.
	er := ge.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.SessionIDs = append(er.Spec.SessionIDs, otherT2)
	})
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if got, want := ge.elements(t), ge.wantAfterErasure(); !maps.Equal(got, want) {
		t.Fatalf("graph after the erasure\n got %v\nwant %v", got, want)
	}
	if !slices.Contains(historyPhases(er), string(lethev1.PhaseGraphReconciled)) {
		t.Fatalf("history %v has no GraphReconciled entry", historyPhases(er))
	}
	ev := stepEvidence(t, er, lethev1.ConditionGraphReconciled)
	counts := map[string]int64{}
	for _, c := range ev.Counts {
		counts[c.Table] = c.Rows
	}
	if counts["graph nodes :Fact"] != 5 || counts["graph nodes :Session"] != 2 || counts["graph nodes :Entity"] != 3 {
		t.Fatalf("graph evidence counts %v", counts)
	}
	if len(ev.Verification) == 0 {
		t.Fatal("no graph verification recorded")
	}
	for _, v := range ev.Verification {
		if v.Found != 0 {
			t.Errorf("verification %q found %d", v.Check, v.Found)
		}
	}
	if n := ge.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'GraphReconciled'`, string(er.UID)); n != 2 {
		t.Fatalf("%d graph receipts, want one per batch of one session: 2", n)
	}
	assertNoPersonalData(t, er)

	// A deriver working from a stale source writes a fact of an erased
	// session again: the re-verification prunes it and records it.
	if err := fixture.WriteGraph(context.Background(), ge.g, []fixture.GraphFact{{ID: 424242, SessionID: erasedA, Entities: []string{"Shared", "Stale"}}}); err != nil {
		t.Fatal(err)
	}
	waitHistoryEntry(t, er, string(lethev1.PhaseBackupsRotated)+"/"+lethev1.ReasonResurrected)
	if got, want := ge.elements(t), ge.wantAfterErasure(); !maps.Equal(got, want) {
		t.Fatalf("graph after the re-verification\n got %v\nwant %v", got, want)
	}
}

// A request deleted once complete no longer re-verifies its erasure: the
// store's audit prunes what a late derivation job writes of its sessions,
// through the provenance indexes, without waiting for the weekly sweep.
func TestLateGraphWritesOfAGoneRequestsSessionsArePruned(t *testing.T) {
	ctx := context.Background()
	ge := newGraphEnv(t, "lategone", fdb.URL(), nil)
	er := ge.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	deleteAndWaitGone(t, er)
	store := &lethev1.MemoryStore{}
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(ge.store), store); err != nil {
			return err
		}
		if store.Status.GraphSweep == nil || store.Status.GraphSweep.Result != lethev1.SweepCompleted {
			return fmt.Errorf("no completed full sweep yet: %+v", store.Status.GraphSweep)
		}
		return nil
	})
	sweepStarted := store.Status.GraphSweep.StartedAt
	events := storeEvents(t, store, lethev1.ReasonResurrected)
	pruned, _ := counterValue(t, "lethe_graph_reappeared_pruned_total", "kind", "nodes")

	if err := fixture.WriteGraph(ctx, ge.g, []fixture.GraphFact{{ID: 434343, SessionID: erasedA, Entities: []string{"Shared", "Late"}}}); err != nil {
		t.Fatal(err)
	}
	if got := ge.elements(t); maps.Equal(got, ge.wantAfterErasure()) {
		t.Fatal("the late write added nothing to the graph")
	}
	eventually(t, 30*time.Second, func() error {
		if got, want := ge.elements(t), ge.wantAfterErasure(); !maps.Equal(got, want) {
			return fmt.Errorf("graph\n got %v\nwant %v", got, want)
		}
		return nil
	})
	eventually(t, 10*time.Second, func() error {
		if storeEvents(t, store, lethev1.ReasonResurrected) <= events {
			return errors.New("no Resurrected event on the store")
		}
		return nil
	})
	if now, _ := counterValue(t, "lethe_graph_reappeared_pruned_total", "kind", "nodes"); now < pruned+3 {
		t.Errorf("lethe_graph_reappeared_pruned_total{kind=nodes} went from %v to %v, want the fact, its session and the Late entity", pruned, now)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(ge.store), store); err != nil {
		t.Fatal(err)
	}
	if !store.Status.GraphSweep.StartedAt.Equal(&sweepStarted) {
		t.Fatal("a full sweep ran meanwhile: the test cannot tell which removed the late write")
	}
}

// A dry run's plan says what the graph step would prune, and changes nothing.
func TestDryRunPlansTheGraphStep(t *testing.T) {
	ge := newGraphEnv(t, "graph-plan", fdb.URL(), nil)
	er := ge.request(t, "plan", func(er *lethev1.ErasureRequest) { er.Spec.DryRun = true })
	waitPhase(t, er, lethev1.PhasePlanned)
	got := &lethev1.ErasureRequest{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), got); err != nil {
		t.Fatal(err)
	}
	plan := got.Status.Plan
	// The erasure prunes 5 facts and 2 sessions alone (see the graph step's
	// test) and the entities only they name, with their relationships.
	if plan == nil || plan.GraphNodes < 7 || plan.GraphRelationships == 0 {
		t.Fatalf("plan %+v: want at least 7 graph nodes and some relationships", plan)
	}
	if after := ge.elements(t); !maps.Equal(after, ge.before) {
		t.Fatalf("a dry run changed the graph\n got %v\nwant %v", after, ge.before)
	}
}

func TestGraphOutageAndCrashesBetweenBatches(t *testing.T) {
	own, err := testenv.StartFalkorDB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Stop)
	ge := newGraphEnv(t, "graph-outage", own.URL(), nil)

	var mu sync.Mutex
	crashes := 0
	restore := setCrashHook(func(ns, point string) bool {
		mu.Lock()
		defer mu.Unlock()
		if ns == ge.ns && point == "between-graph-batches" && crashes < 2 {
			crashes++
			return true
		}
		return false
	})
	t.Cleanup(restore)

	if err := own.SaveAndStop(); err != nil {
		t.Fatal(err)
	}
	er := ge.request(t, "forget", nil)
	c := waitStepReason(t, er, lethev1.ConditionGraphReconciled, lethev1.ReasonGraphUnavailable)
	if !strings.Contains(c.Message, "FalkorDB") {
		t.Fatalf("condition message %q does not say FalkorDB is the problem", c.Message)
	}
	if err := own.Restart(); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if got, want := ge.elements(t), ge.wantAfterErasure(); !maps.Equal(got, want) {
		t.Fatalf("graph after outage and crashes\n got %v\nwant %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if crashes != 2 {
		t.Fatalf("%d crashes between graph batches, want 2", crashes)
	}
	if n := ge.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'GraphReconciled'`, string(er.UID)); n != 2 {
		t.Fatalf("%d graph receipts, want 2", n)
	}
}

func TestStoreSweepRemovesOrphansAndRecordsIt(t *testing.T) {
	const orphan = "eeeeeeee-0000-4000-8000-00000000000e"
	plant := func(ctx context.Context, g *graph.Graph) {
		if err := fixture.WriteGraph(ctx, g, []fixture.GraphFact{{ID: 909090, SessionID: orphan, Entities: []string{"Shared", "Ghost"}}}); err != nil {
			t.Fatal(err)
		}
		// Without provenance: Ghost's relationship to Kept goes with Ghost
		// (only the orphan attests it); Shared's to Kept stays and is counted.
		for _, q := range []string{
			"CREATE (:Entity {key: 'lonely', name: 'Lonely'})",
			"MATCH (a:Entity {key: 'ghost'}), (b:Entity {key: 'kept'}) CREATE (a)-[:RELATES]->(b)",
			"MATCH (a:Entity {key: 'shared'}), (b:Entity {key: 'kept'}) CREATE (a)-[:RELATES]->(b)",
		} {
			if _, err := g.Query(ctx, q, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := sweepCount(t, lethev1.SweepCompleted)
	ge := newGraphEnv(t, "sweep", fdb.URL(), plant)
	store := &lethev1.MemoryStore{}
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(ge.store), store); err != nil {
			return err
		}
		if s := store.Status.GraphSweep; s == nil || s.Result != lethev1.SweepCompleted || store.Status.LastSweep == nil {
			return fmt.Errorf("graphSweep %+v", s)
		}
		return nil
	})
	s := store.Status.GraphSweep
	removed := map[string]int64{}
	for _, c := range s.Removed {
		removed[c.Table] = c.Rows
	}
	if s.OrphanSessions != 1 || removed["graph nodes :Session"] != 1 || removed["graph nodes :Fact"] != 1 || removed["graph nodes :Entity"] != 2 ||
		removed["graph relationships "+graph.AttachedKey] != 1 {
		t.Fatalf("sweep status %+v", s)
	}
	if s.ProvenancelessNodes != 0 || s.ProvenancelessRelationships != 1 {
		t.Fatalf("sweep status counts %d nodes and %d relationships without provenance, want 0 and 1", s.ProvenancelessNodes, s.ProvenancelessRelationships)
	}
	want := maps.Clone(ge.before)
	want["RELATES   shared>kept"]++
	if got := ge.elements(t); !maps.Equal(got, want) {
		t.Fatalf("graph after the sweep\n got %v\nwant %v", got, want)
	}
	if after := sweepCount(t, lethev1.SweepCompleted); after <= before {
		t.Fatalf("lethe_graph_sweeps_total{result=Completed} stayed at %v", after)
	}
	if !meta.IsStatusConditionTrue(store.Status.Conditions, lethev1.MemoryStoreGraphReady) {
		t.Fatal("GraphReady is not True")
	}

	series := "lethe_graph_provenanceless_elements{kind=%s,namespace=" + store.Namespace + ",store=" + store.Name + "}"
	values := provenancelessValues(t)
	for kind, want := range map[string]float64{"nodes": 0, "relationships": 1} {
		if got, ok := values[fmt.Sprintf(series, kind)]; !ok || got != want {
			t.Errorf(series+" = %v (exported: %v), want %v", kind, got, ok, want)
		}
	}
	// A deleted store's series go with it.
	if err := k8s.Delete(context.Background(), store); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		for key := range provenancelessValues(t) {
			if strings.Contains(key, "namespace="+store.Namespace+",") {
				return fmt.Errorf("%s still exported after the store was deleted", key)
			}
		}
		return nil
	})
}

// provenancelessValues gathers lethe_graph_provenanceless_elements; no label may name an entity.
func provenancelessValues(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range flatten(t, mfs, "Ghost", "ghost", "Shared", "shared", "Kept", "kept") {
		if strings.HasPrefix(k, "lethe_graph_provenanceless_elements{") {
			out[k] = v
		}
	}
	return out
}

func sweepCount(t *testing.T, result string) float64 {
	t.Helper()
	v, _ := counterValue(t, "lethe_graph_sweeps_total", "result", result)
	return v
}

// counterValue reads, from the suite manager's registry, the counter name's
// series whose label has value; found is false when there is none.
func counterValue(t *testing.T, name, label, value string) (v float64, found bool) {
	m := metricWith(t, name, label, value)
	return m.GetCounter().GetValue(), m != nil
}

// gaugeValue reads the gauge name's series whose label has value (-1 when
// there is none).
func gaugeValue(t *testing.T, name, label, value string) float64 {
	if m := metricWith(t, name, label, value); m != nil {
		return m.GetGauge().GetValue()
	}
	return -1
}

// metricWith is the series of metric name whose label has value, nil when
// there is none.
func metricWith(t *testing.T, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}

func stepEvidence(t *testing.T, er *lethev1.ErasureRequest, step string) lethev1.StepEvidence {
	t.Helper()
	if er.Status.Evidence != nil {
		for _, s := range er.Status.Evidence.Steps {
			if s.Step == step {
				return s
			}
		}
	}
	t.Fatalf("no evidence of step %s", step)
	return lethev1.StepEvidence{}
}

// With a person label, each store audit feeds the graph's person names to
// the database's names dictionary, which the redaction trigger then
// applies; a person gone from the graph leaves it. Other entities' names
// are not fed.
func TestThePersonsOfTheGraphFeedTheNamesDictionary(t *testing.T) {
	ctx := context.Background()
	ge := newGraphEnv(t, "persons", fdb.URL(), func(ctx context.Context, g *graph.Graph) {
		// Mentioned by a kept session's fact, as a derivation job writes them
		// (an entity nothing attests is swept).
		if _, err := g.Query(ctx, `MATCH (f:Fact {session_id: $s}) WITH f LIMIT 1
			CREATE (f)-[:MENTIONS {fact_id: f.id, session_id: f.session_id}]->(:Entity:Person {key: 'barbara liskov', name: 'Barbara Liskov'}),
				(f)-[:MENTIONS {fact_id: f.id, session_id: f.session_id}]->(:Entity {key: 'clu', name: 'Clu Language'})`,
			map[string]any{"s": keptB}); err != nil {
			t.Fatal(err)
		}
	})
	graphNames := func() []string {
		rows, err := ge.conn.Query(ctx, `SELECT name FROM lethe.redaction_names WHERE source = 'graph' ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	waitCondition(t, ge.store, lethev1.MemoryStoreRedactionCompliant, metav1.ConditionTrue, lethev1.ReasonRedacted)
	if n := graphNames(); len(n) != 0 {
		t.Fatalf("names fed without a person label: %v", n)
	}
	patch := client.MergeFrom(ge.store.DeepCopy())
	ge.store.Spec.FalkorDB.PersonLabel = "Person"
	if err := k8s.Patch(ctx, ge.store, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if n := graphNames(); !slices.Equal(n, []string{"Barbara Liskov"}) {
			return fmt.Errorf("graph-fed names %v, want [Barbara Liskov]", n)
		}
		return nil
	})
	if _, err := ge.conn.Exec(ctx, `UPDATE memory.rounds SET assistant_thinking = 'ask barbara liskov about Clu Language' WHERE session_id = $1`, keptB); err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := ge.conn.QueryRow(ctx, `SELECT assistant_thinking FROM memory.rounds WHERE session_id = $1 LIMIT 1`, keptB).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != "ask [person] about Clu Language" {
		t.Fatalf("stored %q, want the person's name replaced and the other entity's kept", stored)
	}
	if _, err := ge.g.Query(ctx, `MATCH (e:Person) DETACH DELETE e`, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if n := graphNames(); len(n) != 0 {
			return fmt.Errorf("graph-fed names %v after the person left the graph, want none", n)
		}
		return nil
	})
}
