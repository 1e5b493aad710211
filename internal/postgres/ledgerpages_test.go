package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// ledgerPages maps each session ledger row of the request uid to the heap
// page it is on, and counts those not marked erased.
func ledgerPages(t *testing.T, conn *pgx.Conn, uid string) (map[string]int64, int) {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT record_id, (ctid::text::point)[0]::bigint, erased_at IS NULL
		FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session'`, uid)
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]int64{}
	notErased := 0
	var id string
	var page int64
	var open bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &page, &open}, func() error {
		pages[id] = page
		if open {
			notErased++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return pages, notErased
}

// ledgerUpdateCounters polls the ledger's updated and heap-only updated
// rows (pg_stat_user_tables, since the database was made) until at least
// want updates are counted: a connection's counters reach the server
// shortly after it ends.
func ledgerUpdateCounters(t testing.TB, conn *pgx.Conn, want int64) (upd, hot int64) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := conn.QueryRow(context.Background(), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE relid = 'lethe.erasure_ledger'::regclass`).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		if upd >= want || time.Now().After(deadline) {
			return upd, hot
		}
	}
}

// A deletion updates each session's ledger row twice (erased in the batch,
// dated again after its commit). Migration 00019 leaves room on the pages a
// tombstone writes, so both updates are heap-only (no new entry in any
// ledger index) and the rows stay on their pages; without it the pages
// the tombstone filled send the updates elsewhere. An index that covers a
// column the updates change fails it too.
func TestDeletionUpdatesLedgerRowsOnTheirPages(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	ids := seedBench(t, conn, "c1000000", 300, 4, 1, false)
	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	req := erasure.Request{UID: "uid-ledger-pages", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	before, open := ledgerPages(t, conn, req.UID)
	if len(before) != len(ids) || open != len(ids) {
		t.Fatalf("after the tombstone: %d ledger rows, %d not erased; want %d of each", len(before), open, len(ids))
	}
	var pages int
	if err := conn.QueryRow(ctx, `SELECT count(DISTINCT (ctid::text::point)[0]) FROM lethe.erasure_ledger`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	// More than one page: the tombstone filled pages (to the fillfactor)
	// before the last.
	if pages < 2 {
		t.Fatalf("the ledger is on %d page; the test needs the tombstone to fill pages", pages)
	}
	updBefore, hotBefore := ledgerUpdateCounters(t, conn, 0)
	if _, err := e.Delete(ctx, req, 100, 0); err != nil {
		t.Fatal(err)
	}
	// The deletion's connections hand in their counters as they close.
	pool.Close()
	after, open := ledgerPages(t, conn, req.UID)
	if open != 0 {
		t.Fatalf("%d sessions not marked erased", open)
	}
	moved := 0
	for id, page := range before {
		if after[id] != page {
			moved++
		}
	}
	upd, hot := ledgerUpdateCounters(t, conn, updBefore+2*int64(len(ids)))
	upd, hot = upd-updBefore, hot-hotBefore
	if upd < 2*int64(len(ids)) {
		t.Fatalf("%d ledger updates counted, want at least %d (two per session)", upd, 2*len(ids))
	}
	if moved > 0 || hot != upd {
		t.Errorf("the deletion updated ledger rows %d times, %d of them heap-only; %d of %d session rows moved to another page (ledger on %d pages)",
			upd, hot, moved, len(before), pages)
	}
}
