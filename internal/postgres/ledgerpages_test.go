package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
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

// A deletion updates each session's ledger row twice (erased in the batch,
// dated again after its commit). Migration 00019 leaves room on the pages a
// tombstone writes, so both updates stay on the row's page (heap-only: no
// new entry in either ledger index); without it every page the tombstone
// filled sends the updates to another page.
func TestDeletionUpdatesLedgerRowsOnTheirPages(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	ids := seedBench(t, conn, "c1000000", 300, 4, 1, false)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-ledger-pages", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	before, open := ledgerPages(t, conn, req.UID)
	if len(before) != len(ids) || open != len(ids) {
		t.Fatalf("after the tombstone: %d ledger rows, %d not erased; want %d of each", len(before), open, len(ids))
	}
	var full int
	if err := conn.QueryRow(ctx, `SELECT count(DISTINCT (ctid::text::point)[0]) FROM lethe.erasure_ledger`).Scan(&full); err != nil {
		t.Fatal(err)
	}
	// More than one page: the tombstone filled pages (to its fillfactor)
	// before the last.
	if full < 2 {
		t.Fatalf("the ledger is on %d page; the test needs the tombstone to fill pages", full)
	}
	if _, err := e.Delete(ctx, req, 100, 0); err != nil {
		t.Fatal(err)
	}
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
	if moved > 0 {
		t.Errorf("%d of %d session ledger rows moved to another page during the deletion (on %d pages): their updates were not heap-only",
			moved, len(before), full)
	}
}
