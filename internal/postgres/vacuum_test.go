package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/testenv"
)

const marker = "MARKER-ZEBRA-7731"

// markerIn counts, over every page of memory.rounds, the tuples whose data
// holds the marker (pageinspect's heap_page_items: every line pointer, dead
// or alive), and the pages whose raw bytes hold it anywhere (free space too).
func markerIn(t *testing.T, conn *pgx.Conn) (tuples, pages int64) {
	t.Helper()
	pagesSQL := `generate_series(0, (pg_relation_size('memory.rounds') / current_setting('block_size')::int)::int - 1) b`
	tuples = count(t, conn, `SELECT count(*) FROM `+pagesSQL+`, heap_page_items(get_raw_page('memory.rounds', b))
		WHERE position($1::bytea IN coalesce(t_data, ''::bytea)) > 0`, []byte(marker))
	pages = count(t, conn, `SELECT count(*) FROM `+pagesSQL+` WHERE position($1::bytea IN get_raw_page('memory.rounds', b)) > 0`, []byte(marker))
	return tuples, pages
}

// erasedWithMarker seeds the tenants, writes the marker into one of the
// erased session's rounds, and erases the session: its tuples are dead,
// still in the pages.
func erasedWithMarker(t *testing.T) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	mustExec(t, conn, `CREATE EXTENSION IF NOT EXISTS pageinspect`)
	mustExec(t, conn, `ALTER TABLE memory.rounds SET (autovacuum_enabled = off)`)
	seedTenants(t, conn)
	mustExec(t, conn, `UPDATE memory.rounds SET user_text = $1 || ' said the round' WHERE session_id = $2 AND round_index = 2`, marker, sessA)
	mustExec(t, conn, `VACUUM memory.rounds`) // the update's old version goes; the marker is in one live tuple
	if tuples, _ := markerIn(t, conn); tuples != 1 {
		t.Fatalf("%d tuples hold the marker before the erasure, want 1", tuples)
	}
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-vacuum", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 100, 0); err != nil {
		t.Fatal(err)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.rounds WHERE user_text LIKE '%' || $1 || '%'`, marker); n != 0 {
		t.Fatalf("%d rounds with the marker visible after the deletion", n)
	}
	if tuples, _ := markerIn(t, conn); tuples != 1 {
		t.Fatalf("%d tuples hold the marker right after the deletion, want 1 (dead, readable with pageinspect): the test's premise", tuples)
	}
	return conn, dsn
}

// After the deletion the erased round is gone from SQL but its dead tuple
// is readable with pageinspect; the vacuum step removes it.
func TestLazyVacuumMakesTheErasedTuplesUnreadable(t *testing.T) {
	conn, dsn := erasedWithMarker(t)
	res, err := eraser(t, dsn, "t1").Vacuum(context.Background(), lethev1.VacuumLazy)
	if err != nil {
		t.Fatal(err)
	}
	if res.Vacuumed == 0 || res.NotPermitted != 0 || res.At.IsZero() {
		t.Fatalf("vacuum result %+v", res)
	}
	if tuples, _ := markerIn(t, conn); tuples != 0 {
		t.Fatalf("%d tuples still hold the erased marker after the vacuum", tuples)
	}
}

// Full rewrites the table: not even the pages' free space holds the marker.
func TestFullVacuumLeavesNoByteOfTheErasedRows(t *testing.T) {
	conn, dsn := erasedWithMarker(t)
	if _, pages := markerIn(t, conn); pages == 0 {
		t.Fatal("no page holds the marker before the vacuum: the test's premise")
	}
	if _, err := eraser(t, dsn, "t1").Vacuum(context.Background(), lethev1.VacuumFull); err != nil {
		t.Fatal(err)
	}
	if tuples, pages := markerIn(t, conn); tuples != 0 || pages != 0 {
		t.Fatalf("after a full vacuum %d tuples and %d pages still hold the marker", tuples, pages)
	}
}

// A role that neither owns the tables nor holds MAINTAIN vacuums nothing:
// the tables are counted, not an error.
func TestVacuumWithoutPermissionCountsTheTables(t *testing.T) {
	conn, dsn := erasedWithMarker(t)
	mdsn, err := testenv.ManagerDSN(context.Background(), dsn, true)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eraser(t, mdsn, "t1").Vacuum(context.Background(), lethev1.VacuumLazy)
	if err != nil {
		t.Fatal(err)
	}
	if res.Vacuumed != 0 || res.NotPermitted == 0 {
		t.Fatalf("vacuum as a role without ownership: %+v, want every table counted as not permitted", res)
	}
	if tuples, _ := markerIn(t, conn); tuples != 1 {
		t.Fatalf("%d tuples hold the marker, want 1: nothing was vacuumed", tuples)
	}
}

// One erased session in a large table: a vacuum left to its defaults skips
// the index when few pages hold dead tuples, and the erased text stays in
// the index's pages. The step's vacuum cleans the indexes always.
func TestLazyVacuumRemovesTheErasedIndexEntriesOfALargeTable(t *testing.T) {
	ctx := context.Background()
	conn, dsn := erasedWithMarker(t)
	// Make the table large, and index its text, as an adopter's own index
	// on a memory table would.
	mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text)
		SELECT $1, 100 + g, 'filler round ' || g || ' ' || repeat('x', 200) FROM generate_series(1, 20000) g`, sessB)
	mustExec(t, conn, `CREATE INDEX rounds_user_text ON memory.rounds (user_text)`)
	if pages := count(t, conn, `SELECT pg_relation_size('memory.rounds') / current_setting('block_size')::int`); pages < 200 {
		t.Fatalf("memory.rounds has %d pages: too small for the case", pages)
	}
	// A session with the marker, indexed, then erased by a second request.
	mustExec(t, conn, `INSERT INTO memory.sessions (id, tenant_id, summary) VALUES ('00000000-0000-4000-8000-0000000000dd', 't1', 's')`)
	mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text) VALUES ('00000000-0000-4000-8000-0000000000dd', 0, $1 || ' second')`, marker)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-index", SessionIDs: []string{"00000000-0000-4000-8000-0000000000dd"}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 100, 0); err != nil {
		t.Fatal(err)
	}
	inIndex := func() int64 {
		return count(t, conn, `SELECT count(*) FROM generate_series(1, (pg_relation_size('memory.rounds_user_text') / current_setting('block_size')::int)::int - 1) b,
			bt_page_items('memory.rounds_user_text', b) i
			WHERE i.data LIKE '%' || regexp_replace(encode($1::bytea, 'hex'), '(..)(?!$)', '\1 ', 'g') || '%'`, []byte(marker[:7]))
	}
	if n := inIndex(); n == 0 {
		t.Fatal("the erased round's text is not in the index after the deletion: the test's premise")
	}
	if _, err := e.Vacuum(ctx, lethev1.VacuumLazy); err != nil {
		t.Fatal(err)
	}
	if n := inIndex(); n != 0 {
		t.Fatalf("%d index entries still hold the erased text after the vacuum", n)
	}
}

// Deletions share their vacuums, but a deletion that commits while a
// vacuum runs is not covered by it: that vacuum may have passed the
// deletion's tables already. The worst point: the running vacuum has done
// memory.rounds and waits for memory.sessions (a lock held by the test)
// when two deletions commit — one of them of a round holding the marker —
// and ask for a vacuum. Both get the next vacuum, one for the two, which
// does memory.rounds again.
func TestAVacuumRunningWhenADeletionCommitsDoesNotCountForIt(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	mustExec(t, conn, `CREATE EXTENSION IF NOT EXISTS pageinspect`)
	mustExec(t, conn, `ALTER TABLE memory.rounds SET (autovacuum_enabled = off)`)
	seedTenants(t, conn)
	mustExec(t, conn, `UPDATE memory.rounds SET user_text = $1 || ' said the round' WHERE session_id = $2 AND round_index = 2`, marker, sessA)
	mustExec(t, conn, `VACUUM memory.rounds`)

	memo := &postgres.AuditMemo{}
	first, second, third := eraser(t, dsn, "t1"), eraser(t, dsn, "t1"), eraser(t, dsn, "t1")
	second.Pool, third.Pool = first.Pool, first.Pool
	first.Memo, second.Memo, third.Memo = memo, memo, memo
	reqA := erasure.Request{UID: "uid-a", SessionIDs: []string{sessA}}
	reqB := erasure.Request{UID: "uid-b", SessionIDs: []string{sessB}}
	for _, r := range []erasure.Request{reqA, reqB} {
		if _, err := first.Tombstone(ctx, r); err != nil {
			t.Fatal(err)
		}
	}

	holder := connect(t, dsn)
	mustExec(t, holder, `BEGIN`)
	mustExec(t, holder, `LOCK TABLE memory.sessions IN SHARE UPDATE EXCLUSIVE MODE`)
	running := make(chan error, 1)
	go func() { _, err := first.Vacuum(ctx, lethev1.VacuumLazy); running <- err }()
	waitForLock(t, conn, "VACUUM %sessions%")

	if _, err := second.Delete(ctx, reqA, 100, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := third.Delete(ctx, reqB, 100, 0); err != nil {
		t.Fatal(err)
	}
	if tuples, _ := markerIn(t, conn); tuples != 1 {
		t.Fatalf("%d tuples hold the marker after the deletion, want 1 (dead): the test's premise", tuples)
	}
	results := make(chan erasure.VacuumResult, 2)
	for _, e := range []*postgres.Eraser{second, third} {
		go func() {
			res, err := e.Vacuum(ctx, lethev1.VacuumLazy)
			if err != nil {
				t.Error(err)
			}
			results <- res
		}()
	}
	for deadline := time.Now().Add(20 * time.Second); first.VacuumsWaiting() != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d deletions wait for a vacuum, want 2", first.VacuumsWaiting())
		}
	}
	if n := first.VacuumsStarted(); n != 1 {
		t.Fatalf("%d vacuums started while the first waits for its lock, want 1", n)
	}
	mustExec(t, holder, `COMMIT`)
	if err := <-running; err != nil {
		t.Fatal(err)
	}
	a, b := <-results, <-results
	if tuples, _ := markerIn(t, conn); tuples != 0 {
		t.Fatalf("%d tuples still hold the erased marker after the deletions' vacuum", tuples)
	}
	if n := first.VacuumsStarted(); n != 2 || a.At != b.At || a.Vacuumed == 0 {
		t.Fatalf("%d vacuums started, the two deletions' results %+v and %+v: want 2 (the running one and one shared)", n, a, b)
	}
}

// A shared vacuum covers the tables of the layout when it starts: an
// Eraser that read the layout before a cascading table was added still has
// the new table vacuumed, since a deletion that joins may have used it.
func TestAVacuumCoversATableAddedAfterItsEraserReadTheLayout(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	before, err := e.Vacuum(ctx, lethev1.VacuumLazy)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `CREATE TABLE memory.late_notes (id bigserial PRIMARY KEY,
		session_id uuid NOT NULL REFERENCES memory.sessions(id) ON DELETE CASCADE, body text)`)
	after, err := e.Vacuum(ctx, lethev1.VacuumLazy)
	if err != nil {
		t.Fatal(err)
	}
	if after.Vacuumed != before.Vacuumed+1 {
		t.Fatalf("vacuumed %d tables, then %d after a cascading table was added: want one more", before.Vacuumed, after.Vacuumed)
	}
}
