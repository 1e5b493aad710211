package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/lethe-dev/lethe/internal/erasure"
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
	analyzed := func() (neverAnalyzed bool, analyzes int64) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT c.reltuples < 0, coalesce(s.analyze_count, 0) FROM pg_class c
			LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = 'lethe.erasure_ledger'::regclass`).Scan(&neverAnalyzed, &analyzes); err != nil {
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
