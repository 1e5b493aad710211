package history

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	pgxvec "github.com/pgvector/pgvector-go/pgx"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// plannedRequest is one ErasureRequest of a run, as the run created it.
type plannedRequest struct {
	Name      string
	Sessions  []string
	Immediate bool
	Grace     time.Duration
	// CancelAfter is when the run sets spec.cancel (0: never).
	CancelAfter time.Duration
	UID         string
	// CancelRV is the resource version of the accepted cancel (0: none).
	CancelRV int64
}

// runPlan is what a run set up: its tenant's sessions, the requests, the
// Backups and the graph.
type runPlan struct {
	ID       int
	Seed     uint64
	NS       string
	Tenant   string
	GraphKey string
	Own      []string // the tenant's sessions
	Foreign  string   // another tenant's session, named by a request
	Unknown  string   // a requested ID that never existed
	Requests []*plannedRequest
	Backup   string // selected by the run's store
	Decoy    string // another application's Backup
	// DeleteOnImmediate is the store's spec.velero.deleteOnImmediate: only
	// then may the immediate request ask Velero to delete the Backup.
	DeleteOnImmediate bool
}

// runRecord is everything recorded during a run's round, and the end state.
type runRecord struct {
	Plan        *runPlan
	Effects     []dbEffect
	Statuses    []statusObs
	Backups     []backupObs
	DBRs        []dbrObs
	GraphWrites []graphWrite
	Final       map[string]*lethev1.ErasureRequest // by request name
	KeySet      evidence.KeySet                    // the manager's published keys
	GraphBefore map[string]int
	GraphAfter  map[string]int
	RowsBefore  map[string]int64 // rows per session in every table that references it
	RowsAfter   map[string]int64
	// CacheBefore and CacheAfter count, per session, the content-keyed
	// cache entries of its content (the texts name the session).
	CacheBefore map[string]int64
	CacheAfter  map[string]int64
	// TombstonedAfter is, per session still tombstoned at the end, the
	// request holding the tombstone.
	TombstonedAfter map[string]string
	// InForceAfter counts, per request UID, its ledger rows (any scope) not
	// cancelled at the end.
	InForceAfter map[string]int64
	// Reingestions are the run's attempts to ingest its transcripts again.
	Reingestions []reingestion
	// Restore is set when the round restored the database.
	Restore *restoreRecord
	// ReceiptLog is the round's receipt log as the run's checkpoints see it.
	ReceiptLog *receiptLogObs
}

// restoreRecord is what a run's round recorded around its restore.
type restoreRecord struct {
	// AtRestore is each request as the restore found it (a request
	// deleted before the restore: its last state before the deletion).
	AtRestore map[string]*lethev1.ErasureRequest
	// Deleted names the request whose object was deleted before the
	// restore ("" when none of this run's was).
	Deleted string
	// EffectsAfter are the effects recorded after the restore: the
	// restored database's effects table is the dump's, and goes on from there.
	EffectsAfter []dbEffect
	// Findings are what waiting for the erasures to hold again found
	// (a bound passed, the store's ErasuresIntact not True).
	Findings []string
}

var names = []string{"Ada", "Grace", "Linus", "Ken", "Barbara", "Edsger"}

// sessionID is a canonical UUID unique to (run, k).
func sessionID(run, k int) string { return fmt.Sprintf("%08d-0000-4000-8000-%012d", run, k) }

// newPlan draws a run's scenario: six sessions of its tenant (the last never
// requested), an immediate request that also names another tenant's session
// and an unknown ID, a request with a grace period that may be cancelled at
// a random moment, and a third that may overlap either and may be cancelled.
func newPlan(id int, seed uint64) *runPlan {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	p := &runPlan{ID: id, Seed: seed, Tenant: fmt.Sprintf("h%d", id), GraphKey: fmt.Sprintf("history-%d", id),
		Foreign: sessionID(id, 90), Unknown: sessionID(id, 99)}
	for k := range 6 {
		p.Own = append(p.Own, sessionID(id, k))
	}
	grace := func(choices ...int) time.Duration {
		// 0 stands for the shortest grace period admission lets a request
		// that is not immediate have (0s needs immediate).
		return max(time.Duration(choices[rng.IntN(len(choices))])*time.Second, time.Millisecond)
	}
	cancel := func(prob float64) time.Duration {
		if rng.Float64() < prob {
			return time.Duration(1+rng.IntN(4000)) * time.Millisecond
		}
		return 0
	}
	p.Requests = []*plannedRequest{
		{Name: "a", Sessions: []string{p.Own[0], p.Own[1], p.Foreign, p.Unknown}, Immediate: true},
		{Name: "b", Sessions: []string{p.Own[2], p.Own[3]}, Grace: grace(0, 1, 2, 3), CancelAfter: cancel(0.5)},
		{Name: "c", Sessions: []string{p.Own[4]}, Grace: grace(0, 1, 2), CancelAfter: cancel(0.25)},
	}
	switch rng.IntN(5) {
	case 0:
		p.Requests[2].Sessions = append(p.Requests[2].Sessions, p.Own[1])
	case 1:
		p.Requests[2].Sessions = append(p.Requests[2].Sessions, p.Own[2])
	}
	p.DeleteOnImmediate = rng.IntN(2) == 0
	return p
}

// seedRun writes the run's sessions (each mentioning two of a few names, so
// entities are shared), derives its graph, and creates its namespace,
// Secret and the data object its Backup holds. backUp then takes the
// Backup and creates the MemoryStore.
func seedRun(ctx context.Context, e *env, conn *pgx.Conn, g *graph.Graph, p *runPlan) error {
	rng := rand.New(rand.NewPCG(p.Seed, uint64(p.ID)+1))
	for k, s := range append(slices.Clone(p.Own), p.Foreign) {
		tenant := p.Tenant
		if s == p.Foreign {
			tenant = p.Tenant + "-other"
		}
		a, b := names[rng.IntN(len(names))], names[rng.IntN(len(names))]
		if err := fixture.Seed(ctx, conn, fixture.Session{ID: s, Tenant: tenant, Rounds: 2, Text: a + " met " + b, Seed: p.ID*10 + k}); err != nil {
			return err
		}
	}
	facts, err := fixture.ReadFacts(ctx, conn, "memory")
	if err != nil {
		return err
	}
	facts = slices.DeleteFunc(facts, func(f fixture.GraphFact) bool { return !slices.Contains(p.Own, f.SessionID) })
	if err := fixture.WriteGraph(ctx, g, facts); err != nil {
		return err
	}

	p.NS = fmt.Sprintf("history-%d", p.ID)
	if err := e.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.NS}}); err != nil {
		return err
	}
	if err := e.k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: p.NS},
		StringData: map[string]string{"dsn": e.managerDSN, "url": e.fdb.URL()}}); err != nil {
		return err
	}
	// Velero backs the run's namespace up (a stand-in data object in it)
	// before any request: its Backup may hold every erasure of the run.
	p.Backup, p.Decoy = p.NS+"-nightly", decoyBackup
	return e.k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "memory-stand-in", Namespace: p.NS},
		Data: map[string]string{"run": p.NS}})
}

// backUp has Velero back the run's namespace up, waits until the Backup is
// complete, then creates the run's MemoryStore: every request of the run
// comes after its Backup.
//
// A Backup Velero fails (not a fault the history injects: the run has no
// store yet) is deleted and taken once more, counted and logged with
// Velero's reason; a second failure fails the pass.
func backUp(ctx context.Context, tb testing.TB, e *env, f *faults, p *runPlan) error {
	take := func() error {
		// Lethe reads a Backup's labels, times and expiration, never what it
		// holds: the stand-in is all it needs to hold.
		if _, err := e.velero.TakeBackup(ctx, p.Backup, testenv.BackupOptions{Labels: map[string]string{"app": p.NS}, Namespaces: []string{p.NS},
			Resources: []string{"configmaps"}, TTL: 90 * 24 * time.Hour}); err != nil {
			return err
		}
		_, err := e.velero.WaitBackup(ctx, p.Backup)
		return err
	}
	err := take()
	if failed := (*testenv.BackupFailedError)(nil); errors.As(err, &failed) {
		tb.Logf("Velero failed the run's Backup; deleting it and taking it again: %v", err)
		f.countBackupRetaken()
		if _, err := e.velero.DeleteBackup(ctx, p.Backup); err != nil {
			return err
		}
		if err := e.velero.WaitBackupGone(ctx, p.Backup); err != nil {
			return err
		}
		err = take()
	}
	if err != nil {
		return err
	}
	ref := func(key string) lethev1.SecretKeyRef { return lethev1.SecretKeyRef{Name: "memory", Key: key} }
	return e.k8s.Create(ctx, &lethev1.MemoryStore{
		ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: p.NS},
		Spec: lethev1.MemoryStoreSpec{
			TenantID: p.Tenant,
			Postgres: lethev1.PostgresSpec{DSNSecretRef: ref("dsn")},
			FalkorDB: &lethev1.FalkorDBSpec{URLSecretRef: ref("url"), Graph: p.GraphKey},
			Velero: &lethev1.VeleroSpec{Namespace: veleroNS,
				BackupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": p.NS}},
				RotationWindow: &metav1.Duration{Duration: time.Second}, DeleteOnImmediate: p.DeleteOnImmediate},
		},
	})
}

// cleanUp removes what a finished run leaves outside the cluster's API:
// its Backup (Velero's sync and garbage collection walk every Backup each
// second) and its graph (FalkorDB saves and loads every graph at each
// restart). A later run then costs what an earlier one did. The Secret
// stays: the store's finalizer reads it for a last reap of tombstones.
func cleanUp(ctx context.Context, e *env, p *runPlan) error {
	if _, err := e.velero.DeleteBackup(ctx, p.Backup); err != nil {
		return err
	}
	return e.fdb.DeleteGraph(p.GraphKey)
}

// createRequests applies the run's requests and returns when they exist.
func createRequests(ctx context.Context, e *env, p *runPlan) error {
	for _, r := range p.Requests {
		er := &lethev1.ErasureRequest{
			ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: p.NS},
			Spec:       lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"}, Immediate: r.Immediate},
		}
		for _, s := range r.Sessions {
			er.Spec.SessionIDs = append(er.Spec.SessionIDs, lethev1.SessionID(s))
		}
		if r.Immediate {
			er.Spec.Reason = "history checker"
		} else {
			er.Spec.GracePeriod = &metav1.Duration{Duration: r.Grace}
		}
		if err := e.k8s.Create(ctx, er); err != nil {
			return fmt.Errorf("run %d: create %s: %w", p.ID, r.Name, err)
		}
		r.UID = string(er.UID)
	}
	return nil
}

// cancelLater sets spec.cancel at the planned moment and records the
// resource version the API server gave the change.
func cancelLater(ctx context.Context, e *env, p *runPlan, r *plannedRequest, start time.Time) error {
	select {
	case <-time.After(time.Until(start.Add(r.CancelAfter))):
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		er := &lethev1.ErasureRequest{}
		if err := e.k8s.Get(ctx, keyOf(p.NS, r.Name), er); err != nil {
			return err
		}
		if er.Spec.Cancel {
			return nil
		}
		er.Spec.Cancel = true
		err := e.k8s.Update(ctx, er)
		if err == nil {
			r.CancelRV = rvOf(er)
			return nil
		}
		if !strings.Contains(err.Error(), "modified") {
			return fmt.Errorf("run %d: cancel %s: %w", p.ID, r.Name, err)
		}
	}
}

// rowsPerSession counts, per session, its row and every row that
// references it (every table of the memory schema with a session_id, and
// the lineage of derived records).
func rowsPerSession(ctx context.Context, conn *pgx.Conn, ids []string) (map[string]int64, error) {
	var parts []string
	rows, err := conn.Query(ctx, `SELECT table_schema || '.' || table_name FROM information_schema.columns
		WHERE column_name = 'session_id' AND table_schema = 'memory' ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	parts = append(parts, `SELECT id AS s FROM memory.sessions WHERE id = ANY($1::uuid[])`,
		`SELECT source_session_id FROM memory_derived.derivations WHERE source_session_id = ANY($1::uuid[])`)
	for _, t := range tables {
		parts = append(parts, fmt.Sprintf(`SELECT session_id FROM %s WHERE session_id = ANY($1::uuid[])`, t))
	}
	out := map[string]int64{}
	for _, id := range ids {
		out[id] = 0
	}
	rows, err = conn.Query(ctx, `SELECT s::text, count(*) FROM (`+strings.Join(parts, " UNION ALL ")+`) x GROUP BY 1`, ids)
	if err != nil {
		return nil, err
	}
	var id string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	return out, err
}

// cachePerSession counts, per session, the entries of the content-keyed
// embedding cache whose text is the session's content (the fixture's texts
// name their session: summaries and rounds).
func cachePerSession(ctx context.Context, conn *pgx.Conn, ids []string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, id := range ids {
		out[id] = 0
	}
	rows, err := conn.Query(ctx, `SELECT s, count(*) FROM unnest($1::text[]) s
		JOIN memory_derived.embedding_cache c ON strpos(c.text, s) > 0 GROUP BY s`, ids)
	if err != nil {
		return nil, err
	}
	var id string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	return out, err
}

// leftInForce reads, at the end of a run, its sessions still tombstoned
// (by which request) and, per request, its ledger rows not cancelled.
func leftInForce(ctx context.Context, conn *pgx.Conn, p *runPlan) (map[string]string, map[string]int64, error) {
	tombstoned := map[string]string{}
	rows, err := conn.Query(ctx, `SELECT id::text, tombstoned_by FROM memory.sessions WHERE id = ANY($1::uuid[]) AND tombstoned_by IS NOT NULL`,
		append(slices.Clone(p.Own), p.Foreign))
	if err != nil {
		return nil, nil, err
	}
	var id, by string
	if _, err := pgx.ForEachRow(rows, []any{&id, &by}, func() error { tombstoned[id] = by; return nil }); err != nil {
		return nil, nil, err
	}
	uids := make([]string, 0, len(p.Requests))
	for _, r := range p.Requests {
		uids = append(uids, r.UID)
	}
	inForce := map[string]int64{}
	rows, err = conn.Query(ctx, `SELECT request_uid, count(*) FROM lethe.erasure_ledger
		WHERE request_uid = ANY($1::text[]) AND cancelled_at IS NULL GROUP BY 1`, uids)
	if err != nil {
		return nil, nil, err
	}
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { inForce[id] = n; return nil })
	return tombstoned, inForce, err
}

// connect opens a superuser connection with pgvector's types.
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if err := pgxvec.RegisterTypes(ctx, conn); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	return conn, nil
}

func metaOf(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }
