package postgres_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// A transcript whose session was erased is not ingested again under a new
// session ID: the application role's insert fails with SQLSTATE LE002 from
// the tombstone on (during the grace period already), without echoing the
// path; another source is ingested; the ledger holds only a keyed hash of
// the path; a recorded release lets a deliberate re-ingestion through.
func TestErasedSourceIsNotIngestedAgain(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	path := transcriptOf(t, conn, sessA)
	// ingest inserts a session as the application role, as the ingester does.
	ingest := func(id, source string) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL ROLE memory_app`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO memory.sessions (id, tenant_id, source_path) VALUES ($1, 't1', $2)`, id, source)
			return err
		})
	}
	refused := func(step string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "LE002" {
			t.Fatalf("%s: re-ingesting the erased transcript: %v, want SQLSTATE LE002", step, err)
		}
		if strings.Contains(pgErr.Message+pgErr.Detail+pgErr.Hint, path) {
			t.Errorf("%s: the error echoes the source path: %q", step, pgErr.Message)
		}
	}

	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-source", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	refused("grace period", ingest("00000000-0000-4000-8000-0000000000f1", path))
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	refused("after the deletion", ingest("00000000-0000-4000-8000-0000000000f2", path))
	if err := ingest("00000000-0000-4000-8000-0000000000f3", "raw-jsonl/someone-else.jsonl"); err != nil {
		t.Fatalf("another transcript was refused: %v", err)
	}

	plain := sha256.Sum256([]byte(path))
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE scope = 'source' AND request_uid = $1`, req.UID); n != 1 {
		t.Fatalf("%d source ledger rows, want 1", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE record_id IN ($1, $2)`, path, hex.EncodeToString(plain[:])); n != 0 {
		t.Fatal("the ledger holds the path or its plain sha256: a dictionary of erased sources")
	}

	if _, err := conn.Exec(ctx, `SELECT lethe.release_source($1)`, path); err != nil {
		t.Fatal(err)
	}
	if err := ingest("00000000-0000-4000-8000-0000000000f4", path); err != nil {
		t.Fatalf("a released source is still refused: %v", err)
	}
	var releases int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM lethe.source_releases`).Scan(&releases); err != nil || releases != 1 {
		t.Fatalf("releases recorded: %d (%v), want 1", releases, err)
	}
}

// Cancelling a request lifts the refusal of its sources with its tombstones.
func TestCancelledRequestDoesNotBlockItsSources(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	path := transcriptOf(t, conn, sessA)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-cancel-source", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Cancel(ctx, req.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO memory.sessions (id, tenant_id, source_path) VALUES ($1, 't1', $2)`,
		"00000000-0000-4000-8000-0000000000f5", path); err != nil {
		t.Fatalf("the source of a cancelled request is refused: %v", err)
	}
}

// transcriptOf gives the session a transcript path, as the ingester does.
func transcriptOf(t *testing.T, conn *pgx.Conn, id string) string {
	t.Helper()
	path := "raw-jsonl/2026/alice-" + id + ".jsonl"
	if _, err := conn.Exec(context.Background(), `UPDATE memory.sessions SET source_path = $2 WHERE id = $1`, id, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Two requests hold the same session: the first erases it, the second finds
// nothing left to delete. The second is erased all the same — its ledger
// row says so, its verification finds nothing, and neither the restore check
// nor the re-erasure takes it for a restore.
func TestOverlappingRequestsBothEnd(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	first := erasure.Request{UID: "uid-first", SessionIDs: []string{sessA}}
	second := erasure.Request{UID: "uid-second", SessionIDs: []string{sessA}}
	for _, req := range []erasure.Request{first, second} {
		if _, err := e.Tombstone(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	var keys erasure.ContentKeys // the second's
	for _, req := range []erasure.Request{first, second} {
		res, err := e.Delete(ctx, req, 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		keys = res.ContentKeys
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL`, second.UID); n != 1 {
		t.Fatalf("the second request's ledger row is not marked erased (%d)", n)
	}
	checks, err := verifyBothWays(ctx, e, second, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if c.Found != 0 {
			t.Errorf("second request: %s = %d", c.Check, c.Found)
		}
	}
	if findings, err := e.Intact(ctx, []erasure.Request{first, second}); err != nil || len(findings) != 0 {
		t.Errorf("restore check on overlapping requests: %+v %v, want nothing", findings, err)
	}
	if res, err := e.Reerase(ctx, second); err != nil || !res.Skipped {
		t.Errorf("re-erasure of the second request: %+v %v, want nothing to do", res, err)
	}
}

// The erasure key's fingerprint names the key: stable while it stays,
// another once it is replaced, empty without one. Lethe's role reads it, the
// application's cannot. A tombstone's keyed ledger rows (sources, content)
// say the key; the count of requests under another key is 0 until the key
// is replaced, then names the request, and a cancel takes it off.
func TestLedgerRowsSayTheirErasureKey(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, asRole(t, conn, dsn, "lethe_manager", "lethe_operator"), "t1")
	id, err := e.ErasureKeyID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^hmac-sha256:[0-9a-f]{32}$`).MatchString(id) {
		t.Fatalf("key fingerprint %q, want hmac-sha256: and 32 hex digits", id)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL ROLE memory_app; SELECT lethe.erasure_key_id()`)
		return err
	})
	if !strings.Contains(fmt.Sprint(err), "permission denied") {
		t.Errorf("the application role read the key's fingerprint: %v, want permission denied", err)
	}

	transcriptOf(t, conn, sessA)
	req := erasure.Request{UID: "uid-key", SessionIDs: []string{sessA}, Grace: time.Hour}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	rows := func(keyed string) int64 {
		return count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = 'uid-key' AND `+keyed)
	}
	if n, m := rows(`scope = 'source' AND key_id = '`+id+`'`), rows(`scope = 'content' AND key_id = '`+id+`'`); n != 1 || m == 0 {
		t.Fatalf("%d source and %d content rows under the database's key, want 1 and some", n, m)
	}
	if n := rows(`(scope = 'session') <> (key_id IS NULL)`); n != 0 {
		t.Errorf("%d rows with a key where there is no hash or none where there is", n)
	}
	if _, keyID, err := e.SourceHashes(ctx, "uid-key"); err != nil || keyID != id {
		t.Errorf("the source rows' key %q (%v), want %q", keyID, err, id)
	}
	under := func(want int64, when string) {
		t.Helper()
		if n, err := e.UnderOtherKeys(ctx); err != nil || n != want {
			t.Errorf("%s: %d request(s) under another key (%v), want %d", when, n, err, want)
		}
	}
	under(0, "under the database's key")
	mustExec(t, conn, `UPDATE lethe.erasure_key SET key = lethe.gen_random_bytes(32)`)
	if other, err := e.ErasureKeyID(ctx); err != nil || other == id || other == "" {
		t.Errorf("fingerprint after the key was replaced: %q (%v), want another than %q", other, err, id)
	}
	under(1, "the key replaced")
	mustExec(t, conn, `DELETE FROM lethe.erasure_key`)
	if none, err := e.ErasureKeyID(ctx); err != nil || none != "" {
		t.Errorf("fingerprint without a key: %q (%v), want empty", none, err)
	}
	under(1, "no key at all")
	if _, err := e.Cancel(ctx, "uid-key"); err != nil {
		t.Fatal(err)
	}
	under(0, "the request cancelled")
}

// Migration 00022 takes the keyed rows already written to be under the key
// the database has when it runs, and leaves sessions without one; down
// drops the column and the function.
func TestMigrationDatesTheKeyedRowsWithTheKey(t *testing.T) {
	ctx := context.Background()
	dsn, p := databaseAt(t, 21)
	conn := connect(t, dsn)
	for _, scope := range []string{"session", "source", "content"} {
		mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at)
			VALUES ($1, 'r-' || $1, 'uid-old', now(), now())`, scope)
	}
	migrateTo(t, p, 22)
	var id string
	if err := conn.QueryRow(ctx, `SELECT lethe.erasure_key_id()`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	got := queryStrings(t, conn, `SELECT scope || '=' || coalesce(key_id, '') FROM lethe.erasure_ledger ORDER BY scope`)
	if want := []string{"content=" + id, "session=", "source=" + id}; !slices.Equal(got, want) {
		t.Errorf("after the migration: %v, want %v", got, want)
	}
	migrateTo(t, p, 21)
	if n := count(t, conn, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'lethe.erasure_ledger'::regclass AND attname = 'key_id' AND NOT attisdropped`); n != 0 {
		t.Error("down left the key_id column")
	}
	if n := count(t, conn, `SELECT count(*) FROM pg_proc WHERE proname = 'erasure_key_id'`); n != 0 {
		t.Error("down left lethe.erasure_key_id()")
	}
}
