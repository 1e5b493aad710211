package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// ledgerRowsRead is how many ledger rows scans have read since the
// database was made (sequential reads and index fetches), once every
// connection named lethe has ended and handed in its counters.
func ledgerRowsRead(t *testing.T, conn *pgx.Conn) int64 {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var open int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'lethe' AND pid <> pg_backend_pid()`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections of the deletion still open after 15 s", open)
		}
	}
	var n int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables
		WHERE relid = 'lethe.erasure_ledger'::regclass`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A deletion in many batches reads each of the request's ledger rows a
// bounded number of times, not once per batch: a request of 160,000
// sessions in batches of 100 would otherwise read 1,600 times 160,000
// rows. The request's latest erased_at, which the replica wait and the
// backup step key on, is read once, after the last batch.
func TestManyBatchesReadTheLedgerInLinearTime(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	const sessions, batch = 600, 20
	ids := seedBench(t, conn, "c2000000", sessions, 1, 1, false)
	req := erasure.Request{UID: "uid-ledger-reads", SessionIDs: ids}
	open := func() (*postgres.Eraser, func()) {
		pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
		if err != nil {
			t.Fatal(err)
		}
		return &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}, pool.Close
	}
	// PostgreSQL 15 and later hand in a connection's counters before it
	// leaves pg_stat_activity; earlier versions may lose them.
	var version int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		t.Fatalf("PostgreSQL %d: this test counts rows read by the server's statistics, reliable from 15 on; set LETHE_PG_BIN to PostgreSQL 15's bin folder", version)
	}
	e, closePool := open()
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	closePool()
	mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
	before := ledgerRowsRead(t, conn)
	e, closePool = open()
	res, err := e.Delete(ctx, req, batch, 0)
	closePool()
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Batches) != sessions/batch || res.ErasedAt.IsZero() || res.CommitLSN == "" {
		t.Fatalf("%d batches, erased at %v, position %q; want %d batches, a time and a position", len(res.Batches), res.ErasedAt, res.CommitLSN, sessions/batch)
	}
	read := ledgerRowsRead(t, conn) - before
	t.Logf("%d sessions in %d batches of %d: %d ledger rows read (%.1f per session)", sessions, len(res.Batches), batch, read, float64(read)/sessions)
	// The guard, the mark and the dating after the commit each read a
	// batch's rows; the latest erased_at and the last dating's sweep of
	// provisional rows read the request's once each. Reading the request's
	// rows in every batch would be 30 times 600.
	if read > 8*sessions {
		t.Errorf("the deletion read %d ledger rows for %d sessions in %d batches, more than %d: some statement reads the request's rows per batch",
			read, sessions, len(res.Batches), 8*sessions)
	}
	// The reads after the measurement.
	var latest time.Time
	if err := conn.QueryRow(ctx, `SELECT max(erased_at) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session'`, req.UID).Scan(&latest); err != nil {
		t.Fatal(err)
	}
	if !res.ErasedAt.Equal(latest) {
		t.Errorf("the deletion reports erased at %v; the ledger's latest is %v", res.ErasedAt, latest)
	}
	// Every batch, not only the last, dates its sessions again after its
	// commit: no session's ledger row was last written by the transaction
	// that wrote its batch's receipt.
	var undated int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM lethe.erasure_ledger l WHERE l.request_uid = $1 AND l.scope = 'session'
		AND (l.erased_at IS NULL OR l.xmin::text IN (SELECT r.xmin::text FROM lethe.erasure_receipts r WHERE r.request_uid = $1))`, req.UID).Scan(&undated); err != nil {
		t.Fatal(err)
	}
	if undated != 0 {
		t.Errorf("%d of %d sessions not dated again after their batch's commit", undated, sessions)
	}
}
