package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/postgres"
)

func receiptDigest(t *testing.T, conn *pgx.Conn, uid, step string, batch int) string {
	t.Helper()
	var d string
	if err := conn.QueryRow(context.Background(), `SELECT digest FROM lethe.erasure_receipts
		WHERE request_uid = $1 AND step = $2 AND batch = $3`, uid, step, batch).Scan(&d); err != nil {
		t.Fatalf("%s receipt %d of %s: %v", step, batch, uid, err)
	}
	return d
}

func mustDigest(t *testing.T, v any) string {
	t.Helper()
	d, err := evidence.Digest(v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Each receipt's digest is that of what it records, computed by the
// ledger: the plan (in the API's shape, the digest the Tombstoned history
// entry carries), the batch's result, the cancellation, the counts.
func TestReceiptDigestsAreThoseOfWhatTheyRecord(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-digest", SessionIDs: []string{sessA}}
	plan, err := e.Tombstone(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := receiptDigest(t, conn, req.UID, erasure.StepTombstoned, 0), mustDigest(t, erasure.PlanStatus(plan)); got != want {
		t.Errorf("Tombstoned digest %s, want the plan's %s", got, want)
	}
	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := receiptDigest(t, conn, req.UID, erasure.StepDeleted, 0), mustDigest(t, res.Batches[0]); got != want {
		t.Errorf("Deleted digest %s, want the batch result's %s", got, want)
	}
	counts := []erasure.Count{{Table: "graph nodes :Fact", Rows: 3}}
	if err := e.WriteReceipt(ctx, req.UID, erasure.StepGraph, 0, 1, counts); err != nil {
		t.Fatal(err)
	}
	if got, want := receiptDigest(t, conn, req.UID, erasure.StepGraph, 0), mustDigest(t, counts); got != want {
		t.Errorf("GraphReconciled digest %s, want the counts' %s", got, want)
	}

	other := erasure.Request{UID: "uid-digest-cancel", SessionIDs: []string{sessB}, Grace: time.Hour}
	if _, err := e.Tombstone(ctx, other); err != nil {
		t.Fatal(err)
	}
	c, err := e.Cancel(ctx, other.UID)
	if err != nil || c.Lifted != 1 || c.At.IsZero() {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if got, want := receiptDigest(t, conn, other.UID, erasure.StepCancelled, 0), mustDigest(t, map[string]string{"cancelled": other.UID}); got != want {
		t.Errorf("Cancelled digest %s, want %s", got, want)
	}
	again, err := e.Cancel(ctx, other.UID)
	if err != nil || again.Lifted != c.Lifted || !again.At.Equal(c.At) {
		t.Errorf("repeat cancel: %+v %v, want the first run's %+v", again, err, c)
	}
}

// WriteReceipt keeps the first receipt of a batch; AppendReceipt takes
// the next free batch, and concurrent appends lose none.
func TestAppendReceiptTakesTheNextFreeBatchAndLosesNone(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	e := eraser(t, dsn, "")
	const uid = "uid-append"
	if err := e.AppendReceipt(ctx, uid, erasure.StepGraph, 7, nil); err != nil {
		t.Fatal(err)
	}
	r, err := e.Receipts(ctx, uid, erasure.StepGraph)
	if err != nil || len(r) != 1 || r[0].Sessions != 7 {
		t.Fatalf("first append: %+v %v, want batch 0", r, err)
	}
	if err := e.WriteReceipt(ctx, uid, erasure.StepGraph, 2, 1, []erasure.Count{{Table: "x", Rows: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := e.WriteReceipt(ctx, uid, erasure.StepGraph, 2, 5, []erasure.Count{{Table: "x", Rows: 9}}); err != nil {
		t.Fatal(err)
	}
	const appends = 16
	var wg sync.WaitGroup
	errs := make([]error, appends)
	for i := range appends {
		wg.Go(func() {
			errs[i] = e.AppendReceipt(ctx, uid, erasure.StepGraph, 100+i, []erasure.Count{{Table: "run", Rows: int64(i)}})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	r, err = e.Receipts(ctx, uid, erasure.StepGraph)
	if err != nil {
		t.Fatal(err)
	}
	if r[2].Sessions != 1 || r[2].Counts["x"] != 1 {
		t.Errorf("batch 2 = %+v: a repeated WriteReceipt replaced the first receipt", r[2])
	}
	if len(r) != 2+appends {
		t.Fatalf("%d receipts, want %d: a concurrent append was lost", len(r), 2+appends)
	}
	var sessions []int
	for b := 3; b < 3+appends; b++ {
		rc, ok := r[b]
		if !ok {
			t.Fatalf("no receipt for batch %d: appends must take the keys after the highest (2)", b)
		}
		sessions = append(sessions, rc.Sessions)
	}
	slices.Sort(sessions)
	for i, s := range sessions {
		if s != 100+i {
			t.Fatalf("appended receipts carry sessions %v, want 100..%d once each", sessions, 100+appends-1)
		}
	}
}

// resurrect writes the session back, as a restored backup would.
func resurrect(t *testing.T, conn *pgx.Conn, id string) {
	t.Helper()
	mustExec(t, conn, `INSERT INTO memory.sessions (id, tenant_id, summary) VALUES ($1, 't1', 'restored')`, id)
	mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text) VALUES ($1, 0, 'restored')`, id)
}

// Reerase erases a session that came back, under the next free
// Resurrected batch, chosen in its transaction.
func TestReeraseWritesEachResurrectionUnderTheNextBatch(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-back", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if res, err := e.Reerase(ctx, req); err != nil || !res.Skipped || res.Sessions != 0 {
		t.Fatalf("reerase with nothing back: %+v %v", res, err)
	}
	for want := range 2 {
		resurrect(t, conn, sessA)
		res, err := e.Reerase(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Skipped || res.Sessions != 1 || res.Batch != want {
			t.Fatalf("resurrection %d: %+v, want 1 session under batch %d", want, res, want)
		}
		rows := map[string]int64{}
		for _, c := range res.Rows {
			rows[c.Table] = c.Rows
		}
		if rows["memory.sessions"] != 1 || rows["memory.rounds"] != 1 {
			t.Errorf("resurrection %d: rows %v, want the session and its round", want, rows)
		}
		// The receipt digests the result as committed: the WAL position is
		// read after the commit.
		if res.CommitLSN == "" {
			t.Errorf("resurrection %d: no WAL position read after the commit", want)
		}
		committed := res
		committed.CommitLSN = ""
		if got, d := receiptDigest(t, conn, req.UID, erasure.StepResurrected, want), mustDigest(t, committed); got != d {
			t.Errorf("Resurrected digest %s, want the committed result's %s", got, d)
		}
		// The history entry carries DeletedAt; a lost one is found by its
		// receipt's time (Deletion.lostEntry), so the two must be one reading.
		receipts, err := e.Receipts(ctx, req.UID, erasure.StepResurrected)
		if err != nil {
			t.Fatal(err)
		}
		if n, ok := receipts[want].Counts[erasure.CountLedgerRowsPutBack]; !ok || n != res.LedgerRowsRestored {
			t.Errorf("resurrection %d: receipt counts %v, want %q = %d (an entry recorded from the receipt reports it)", want, receipts[want].Counts, erasure.CountLedgerRowsPutBack, res.LedgerRowsRestored)
		}
		if at := receipts[want].At; at.IsZero() || !at.Equal(res.DeletedAt) {
			t.Errorf("resurrection %d: receipt dated %v, want the result's DeletedAt %v", want, at, res.DeletedAt)
		}
		if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 0 {
			t.Fatalf("resurrection %d: the session is still there", want)
		}
	}
	// Two passes at once: one erases, the other finds nothing.
	resurrect(t, conn, sessA)
	other := eraser(t, dsn, "t1")
	var wg sync.WaitGroup
	results := make([]erasure.BatchResult, 2)
	errs := make([]error, 2)
	for i, er := range []*postgres.Eraser{e, other} {
		wg.Go(func() { results[i], errs[i] = er.Reerase(ctx, req) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if results[0].Sessions+results[1].Sessions != 1 || results[0].Skipped == results[1].Skipped {
		t.Fatalf("two concurrent reerases: %+v, want one erasing, one skipped", results)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Resurrected'`, req.UID); n != 3 {
		t.Errorf("%d Resurrected receipts, want 3", n)
	}
}

// crashingDB fails the commit number failAt (counting from 1) of its
// transactions: the transaction rolls back and Commit returns errCrash, as
// if the manager died inside it.
type crashingDB struct {
	postgres.DB
	failAt  int32
	commits atomic.Int32
}

var errCrash = errors.New("simulated crash inside the transaction")

func (d *crashingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := d.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &crashingTx{Tx: tx, db: d}, nil
}

type crashingTx struct {
	pgx.Tx
	db *crashingDB
}

func (t *crashingTx) Commit(ctx context.Context) error {
	if t.db.commits.Add(1) == t.db.failAt {
		_ = t.Rollback(ctx)
		return errCrash
	}
	return t.Tx.Commit(ctx)
}

// A crash inside a deletion transaction (a decorated DB) leaves that batch
// undone, with no receipt; the next run completes it, one receipt per batch.
func TestACrashInsideTheDeletionTransactionIsUndoneAndRedone(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	ids := seedTiny(t, conn, "ffffffff", 5)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-crash", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	crashing := &postgres.Eraser{Pool: &crashingDB{DB: e.Pool, failAt: 2}, Schema: "memory", TenantID: "t1"}
	_, err := crashing.Delete(ctx, req, 2, 0)
	if !errors.Is(err, errCrash) || !strings.Contains(err.Error(), "batch 1") {
		t.Fatalf("delete with a crash in batch 1: %v", err)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, ids); n != 3 {
		t.Fatalf("%d sessions left after the crash, want 3 (batch 0 committed, batch 1 rolled back)", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, req.UID); n != 1 {
		t.Fatalf("%d deletion receipts after the crash, want 1", n)
	}
	res, err := e.Delete(ctx, req, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Batches) != 3 || !res.Batches[0].Skipped || res.Batches[1].Sessions != 2 || res.Batches[2].Sessions != 1 {
		t.Fatalf("the run after the crash: %+v", res.Batches)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, req.UID); n != 3 {
		t.Fatalf("%d deletion receipts, want 3", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, ids); n != 0 {
		t.Fatalf("%d sessions left", n)
	}
}

// Replicas are caught up when each has replayed past the deletion's
// commit; a primary passed as a replica is an error.
func TestReplicasCaughtUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ok, err := (postgres.Replicas{}).CaughtUp(ctx, "0/0"); err != nil || !ok {
		t.Fatalf("no replicas: %v %v, want caught up", ok, err)
	}
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTiny(t, conn, "abababab", 1)
	replica, err := pg.StartReplica()
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Stop()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	rconn := connect(t, replica.DSN(strings.TrimPrefix(u.Path, "/")))
	primary := connect(t, dsn)

	var lsn string
	if err := primary.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	for {
		ok, err := postgres.Replicas{rconn}.CaughtUp(ctx, lsn)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the replica did not replay past %s", lsn)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if ok, err := (postgres.Replicas{rconn}).CaughtUp(ctx, "FFFFFFFF/FFFFFFFF"); err != nil || ok {
		t.Fatalf("a position the replica cannot have reached: %v %v", ok, err)
	}
	_, err = postgres.Replicas{rconn, primary}.CaughtUp(ctx, lsn)
	if err == nil || !strings.Contains(err.Error(), "not a replica") || !strings.Contains(err.Error(), fmt.Sprint("replica ", 1)) {
		t.Fatalf("a primary among the replicas: %v, want its 'not a replica' error", err)
	}
}

// Each batch counts its own rows: consecutive deletion transactions on one
// connection (within the second PostgreSQL 15 waits before flushing its
// statistics counters) used to report the rows of the earlier ones too.
func TestEachBatchCountsOnlyItsOwnRows(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	ids := seedTiny(t, conn, "cdcdcdcd", 7)
	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	req := erasure.Request{UID: "uid-counts", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	receipts, err := e.Receipts(ctx, req.UID, erasure.StepDeleted)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range res.Batches {
		want := int64(b.Sessions)
		for _, c := range b.Rows {
			switch c.Table {
			case "memory.sessions", "memory.rounds", "memory.facts":
				if c.Rows != want {
					t.Errorf("batch %d: %s = %d, want %d", b.Batch, c.Table, c.Rows, want)
				}
				if got := receipts[b.Batch].Counts[c.Table]; got != want {
					t.Errorf("receipt of batch %d: %s = %d, want %d", b.Batch, c.Table, got, want)
				}
			default:
				if c.Rows != 0 {
					t.Errorf("batch %d: %s = %d, want 0", b.Batch, c.Table, c.Rows)
				}
			}
		}
	}
}

// The sessions a store's audit re-checks in the graph: erased (not
// cancelled, not only tombstoned) since the given time, of the store's
// tenant, by requests that no longer have an object.
func TestErasedSessionsOfGoneRequests(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	for _, r := range []struct{ uid, session, tenant, erased, cancelled string }{
		{"gone", "00000000-0000-4000-8000-000000000001", "t1", "now() - interval '1 hour'", "NULL"},
		{"gone", "00000000-0000-4000-8000-000000000002", "t1", "now() - interval '30 days'", "NULL"},
		{"gone", "00000000-0000-4000-8000-000000000003", "t2", "now() - interval '1 hour'", "NULL"},
		{"gone", "00000000-0000-4000-8000-000000000004", "t1", "NULL", "NULL"},
		{"gone-cancelled", "00000000-0000-4000-8000-000000000005", "t1", "NULL", "now()"},
		{"live", "00000000-0000-4000-8000-000000000006", "t1", "now() - interval '1 hour'", "NULL"},
		{"other", "00000000-0000-4000-8000-000000000001", "t1", "now() - interval '2 hours'", "NULL"},
	} {
		mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, erased_at, cancelled_at)
			VALUES ('session', $1, $2, $3, `+r.erased+`, `+r.cancelled+`)`, r.session, r.uid, r.tenant)
	}
	since := time.Now().Add(-14 * 24 * time.Hour)
	for tenant, want := range map[string][]string{
		"t1": {"00000000-0000-4000-8000-000000000001"},
		"t2": {"00000000-0000-4000-8000-000000000003"},
		"":   {"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000003"},
	} {
		got, err := eraser(t, dsn, tenant).ErasedSessionsOfGoneRequests(ctx, []string{"live"}, since)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("tenant %q: %v, want %v", tenant, got, want)
		}
	}
	if got, err := eraser(t, dsn, "t1").ErasedSessionsOfGoneRequests(ctx, nil, since); err != nil || len(got) != 2 {
		t.Errorf("no live request: %v %v, want the two sessions of t1 erased since", got, err)
	}
}
