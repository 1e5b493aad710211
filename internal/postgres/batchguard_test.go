package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// A batch not wholly eligible — one of its sessions erased first by
// another request, one cancelled — is declined by the short way's guard
// and erased the long way: the gone session is recorded erased for this
// request too, the cancelled one stays, the rest go, with one receipt.
func TestTheShortWayDeclinesABatchNotWhollyEligible(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	e := primedEraser(t, dsn, conn)
	ids := seedTiny(t, conn, "dddddddd", 4)
	req := erasure.Request{UID: "uid-partial", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	other := erasure.Request{UID: "uid-first", SessionIDs: ids[:1]}
	if _, err := e.Tombstone(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, other, 10, 0); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `UPDATE lethe.erasure_ledger SET cancelled_at = now() WHERE request_uid = $1 AND record_id = $2`, req.UID, ids[1])

	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w.Declined != 1 || w.Short != 2 {
		t.Errorf("batches by way: %+v, want the other request's short and this one declined", w)
	}
	if len(res.Batches) != 1 || res.Batches[0].Sessions != 2 {
		t.Fatalf("delete result: %+v, want one batch of the 2 eligible sessions", res.Batches)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, ids); n != 1 {
		t.Errorf("%d sessions left, want 1 (the cancelled one)", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND erased_at IS NOT NULL`, req.UID); n != 3 {
		t.Errorf("%d of the request's ledger rows erased, want 3 (the one gone before, the 2 deleted)", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, req.UID); n != 1 {
		t.Errorf("%d Deleted receipts, want 1", n)
	}
}

// A database without lethe.require_batch (migration 00013 not applied)
// erases every batch the long way.
func TestWithoutTheBatchGuardEveryBatchTakesTheLongWay(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	mustExec(t, conn, `DROP FUNCTION lethe.require_batch(boolean, boolean)`)
	e := eraser(t, dsn, "t1")
	ids := seedTiny(t, conn, "eeeeeeee", 5)
	req := erasure.Request{UID: "uid-old-db", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w != (postgres.BatchWays{Declined: 2, Long: 3}) {
		t.Errorf("batches by way: %+v, want 3 the long way (the last 2 declined)", w)
	}
	if len(res.Batches) != 3 {
		t.Fatalf("delete result: %+v", res.Batches)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, ids); n != 0 {
		t.Errorf("%d sessions left", n)
	}
}

// The event trigger that replaces the catalog epoch cannot be switched off
// around a schema change unseen: disabling it ends the short way, and
// enabling it again gives the epoch a new identity, so the next batch
// audits the schema the long way and refuses the change made meanwhile.
func TestTheShortWayNoticesItsEventTriggerSwitchedOffAndOn(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	e := primedEraser(t, dsn, conn)
	ids := seedTiny(t, conn, "ffffffff", 2)
	for i, id := range ids {
		if _, err := e.Tombstone(ctx, erasure.Request{UID: fmt.Sprintf("uid-evt-%d", i), SessionIDs: []string{id}}); err != nil {
			t.Fatal(err)
		}
	}

	mustExec(t, conn, `ALTER EVENT TRIGGER lethe_catalog_changed DISABLE`)
	if _, err := e.Delete(ctx, erasure.Request{UID: "uid-evt-0", SessionIDs: ids[:1]}, 10, 0); err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w.Declined != 1 || w.Short != 1 {
		t.Errorf("batches by way with the event trigger disabled: %+v, want this one declined", w)
	}
	mustExec(t, conn, `CREATE TABLE memory.session_tags (session_id uuid, tag text)`)
	mustExec(t, conn, `ALTER EVENT TRIGGER lethe_catalog_changed ENABLE ALWAYS`)

	_, err := e.Delete(ctx, erasure.Request{UID: "uid-evt-1", SessionIDs: ids[1:]}, 10, 0)
	var ce *erasure.ConfigError
	if !errors.As(err, &ce) || ce.Reason != lethev1.ReasonSchemaChanged || !strings.Contains(ce.Message, "memory.session_tags") {
		t.Fatalf("deletion after a change made with the event trigger off: %v, want %s naming memory.session_tags", err, lethev1.ReasonSchemaChanged)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, ids[1]); n != 1 {
		t.Errorf("the session was deleted (%d left)", n)
	}
}

// An application's temporary tables leave the epoch alone (they cannot
// break the erasure rules); any other DDL replaces it.
func TestTheCatalogEpochChangesWithDDLButNotTemporaryTables(t *testing.T) {
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	epoch := func() string {
		var s string
		if err := conn.QueryRow(context.Background(), `SELECT token::text FROM lethe.catalog_epoch`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	start := epoch()
	mustExec(t, conn, `CREATE TEMP TABLE scratch (id int); CREATE INDEX ON scratch (id); ALTER TABLE scratch ADD COLUMN x int`)
	if got := epoch(); got != start {
		t.Error("a temporary table replaced the catalog epoch")
	}
	for _, ddl := range []string{
		`CREATE TABLE public.other (id int)`,
		`DROP TABLE public.other`,
		`ALTER TABLE memory.rounds NO FORCE ROW LEVEL SECURITY`,
		`COMMENT ON TABLE memory.rounds IS 'x'`,
		`UPDATE lethe.lineage_tables SET source_column = source_column`,
	} {
		before := epoch()
		mustExec(t, conn, ddl)
		if epoch() == before {
			t.Errorf("%q left the catalog epoch unchanged", ddl)
		}
	}
}
