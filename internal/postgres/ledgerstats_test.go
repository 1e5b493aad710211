package postgres_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// A deletion of more than one batch analyzes a ledger without statistics
// (a new database, or one pg_restore just wrote): without them the batch
// statements read every ledger row of the request in each batch. A
// deletion of one batch leaves it as it is, and an analyzed ledger is not
// analyzed again. (Run as the ledger's owner; a role that is not skips it.)
func TestMultiBatchDeletionAnalyzesALedgerWithoutStatistics(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	e := eraser(t, dsn, "t1")
	// "Without statistics" is what the deletion keys on: no column
	// statistics in pg_stats. analyze_count tells a second analyze.
	analyzed := func() (neverAnalyzed bool, analyzes int64) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT
			NOT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = 'lethe' AND tablename = 'erasure_ledger'),
			coalesce((SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'lethe.erasure_ledger'::regclass), 0)`).Scan(&neverAnalyzed, &analyzes); err != nil {
			t.Fatal(err)
		}
		return neverAnalyzed, analyzes
	}
	request := func(uid string, n int) erasure.Request {
		ids := queryStrings(t, conn, fmt.Sprintf(`INSERT INTO memory.sessions (id, tenant_id)
			SELECT gen_random_uuid(), 't1' FROM generate_series(1, %d) RETURNING id::text`, n))
		req := erasure.Request{UID: uid, SessionIDs: ids}
		if _, err := e.Tombstone(ctx, req); err != nil {
			t.Fatal(err)
		}
		return req
	}
	if never, _ := analyzed(); !never {
		t.Fatal("the test database's ledger was analyzed before any deletion: the test shows nothing")
	}

	small := request("uid-small", 10)
	if _, err := e.Delete(ctx, small, 10, 0); err != nil {
		t.Fatal(err)
	}
	if never, _ := analyzed(); !never {
		t.Error("a deletion of one batch analyzed the ledger")
	}

	large := request("uid-large", 25)
	res, err := e.Delete(ctx, large, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Batches) != 3 {
		t.Fatalf("%d batches, want 3", len(res.Batches))
	}
	never, analyzes := analyzed()
	if never {
		t.Fatal("a deletion of 3 batches left the ledger never analyzed")
	}
	if _, err := e.Delete(ctx, request("uid-again", 25), 10, 0); err != nil {
		t.Fatal(err)
	}
	if _, again := analyzed(); again != analyzes {
		t.Errorf("the ledger was analyzed again (%d analyzes, then %d): only a never-analyzed ledger is", analyzes, again)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions`); n != 0 {
		t.Errorf("%d sessions left, want 0", n)
	}
}

// ledgerStatistics counts the column statistics the planner has for the
// ledger (pg_stats) and the ledger's pg_class.reltuples.
func ledgerStatistics(t *testing.T, dsn string) (columns int64, reltuples float64) {
	t.Helper()
	if err := connect(t, dsn).QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM pg_stats WHERE schemaname = 'lethe' AND tablename = 'erasure_ledger'),
		(SELECT reltuples FROM pg_class WHERE oid = 'lethe.erasure_ledger'::regclass)`).Scan(&columns, &reltuples); err != nil {
		t.Fatal(err)
	}
	return columns, reltuples
}

// tombstonedRequest tombstones n new sessions of tenant t1 for uid, grace
// served.
func tombstonedRequest(t *testing.T, e *postgres.Eraser, conn *pgx.Conn, uid string, n int) erasure.Request {
	t.Helper()
	ids := queryStrings(t, conn, fmt.Sprintf(`INSERT INTO memory.sessions (id, tenant_id)
		SELECT gen_random_uuid(), 't1' FROM generate_series(1, %d) RETURNING id::text`, n))
	req := erasure.Request{UID: uid, SessionIDs: ids}
	if _, err := e.Tombstone(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	return req
}

// A database pg_restore wrote carries no statistics (PG 15/16), though the
// index builds set pg_class.reltuples: the first deletion of more than one
// batch analyzes its ledger.
func TestRestoredLedgerIsAnalyzedByTheNextMultiBatchDeletion(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	e := eraser(t, dsn, "t1")
	if _, err := e.Delete(ctx, tombstonedRequest(t, e, conn, "uid-before", 25), 10, 0); err != nil {
		t.Fatal(err)
	}
	pending := tombstonedRequest(t, e, conn, "uid-pending", 25)
	if columns, _ := ledgerStatistics(t, dsn); columns == 0 {
		t.Fatal("the ledger has no statistics before the dump: the test shows nothing")
	}

	file := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(strings.TrimPrefix(mustParse(t, dsn).Path, "/"), file); err != nil {
		t.Fatal(err)
	}
	restored, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Restore(ctx, restored, file); err != nil {
		t.Fatal(err)
	}
	rdsn := pg.DSN(restored)
	columns, reltuples := ledgerStatistics(t, rdsn)
	if columns != 0 || reltuples < 0 {
		t.Fatalf("restored ledger: %d column statistics, reltuples %v: want none and >= 0 (a restore the test models)", columns, reltuples)
	}
	res, err := eraser(t, rdsn, "t1").Delete(ctx, pending, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Batches) != 3 {
		t.Fatalf("%d batches, want 3", len(res.Batches))
	}
	if columns, _ := ledgerStatistics(t, rdsn); columns == 0 {
		t.Error("the first deletion of 3 batches after the restore left the ledger without statistics")
	}
}

// A role without the ledger owner's privileges (the reference setup's
// lethe_operator) does not try: the server would warn on every deletion of
// more than one batch. The deletion itself is not affected.
func TestNonOwnerDeletionDoesNotAnalyzeTheLedger(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	admin := connect(t, dsn)
	opDSN := asRole(t, admin, dsn, "lethe_test_operator", "lethe_operator")
	cfg, err := pgxpool.ParseConfig(opDSN)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var warnings []string
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		warnings = append(warnings, n.Severity+": "+n.Message)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	res, err := e.Delete(ctx, tombstonedRequest(t, e, admin, "uid-operator", 25), 10, 0)
	if err != nil {
		t.Fatalf("delete as lethe_operator: %v", err)
	}
	if len(res.Batches) != 3 {
		t.Fatalf("%d batches, want 3", len(res.Batches))
	}
	if columns, _ := ledgerStatistics(t, dsn); columns != 0 {
		t.Errorf("a role that does not own the ledger analyzed it (%d column statistics)", columns)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(warnings) > 0 {
		t.Errorf("the deletion drew notices from the server: %q", warnings)
	}
	if n := count(t, admin, `SELECT count(*) FROM memory.sessions`); n != 0 {
		t.Errorf("%d sessions left, want 0", n)
	}
}
