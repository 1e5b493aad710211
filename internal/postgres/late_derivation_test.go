package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// A compaction transaction that wrote a profile derived from a session and
// its lineage row, and has not committed when the tombstone comes: the
// tombstone waits for it (it does not slip in between), the profile commits
// with its lineage and goes with the session's deletion — no profile of the
// erased session is left, for the owner either. A derivation that starts
// after the tombstone is refused (LE001), and one without lineage (LE003).
func TestDerivationInFlightLosesToTheErasure(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)

	compaction := connect(t, dsn)
	tx, err := compaction.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `WITH p AS (INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ('t1', 'user', 'late digest') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, $1 FROM p`, sessA); err != nil {
		t.Fatal(err)
	}
	var compactionPID int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&compactionPID); err != nil {
		t.Fatal(err)
	}

	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-late", SessionIDs: []string{sessA}}
	tombstoned := make(chan error, 1)
	go func() {
		_, err := e.Tombstone(ctx, req)
		tombstoned <- err
	}()
	// The tombstone is blocked behind the compaction: one backend waits on
	// the advisory lock the compaction holds.
	waitUntil(t, func() bool {
		var waiting int64
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks w JOIN pg_locks h ON h.locktype = 'advisory'
			AND h.objid = w.objid AND h.classid = w.classid AND h.granted AND h.pid = $1
			WHERE w.locktype = 'advisory' AND NOT w.granted`, compactionPID).Scan(&waiting)
		return waiting == 1
	})
	select {
	case err := <-tombstoned:
		t.Fatalf("the tombstone committed while a derivation from the session was in flight (err %v)", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the compaction that started first must commit: %v", err)
	}
	if err := <-tombstoned; err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.profiles WHERE summary = 'late digest'`); n != 0 {
		t.Fatalf("the profile derived in flight survived the erasure (owner view): %d", n)
	}

	// After the tombstone: refused.
	_, err = conn.Exec(ctx, `WITH p AS (INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ('t1', 'user', 'later') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, $1 FROM p`, sessA)
	wantCode(t, "a derivation after the erasure", err, "LE001")
	// Without lineage: refused at commit.
	_, err = conn.Exec(ctx, `INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ('t1', 'user', 'no lineage')`)
	wantCode(t, "a profile without lineage", err, "LE003")
}

func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Errorf("%s: %v, want SQLSTATE %s", what, err, code)
	}
}

// waitUntil polls cond for up to 10 seconds.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
