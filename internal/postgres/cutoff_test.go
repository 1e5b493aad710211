package postgres_test

import (
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// A backup that starts while a deletion batch runs — here the batch waits on
// a session's row lock — reads the sessions: its snapshot predates the
// commit. The deletion time Lethe compares Backup starts with must be the
// commit's, not the transaction's start, or such a backup counts as clean.
// The backup is a real pg_dump, restored to show what it holds.
func TestDeletionTimeIsTheCommitNotTheStart(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-cutoff", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}

	// Another transaction holds the session's row: the batch starts and waits.
	blocker := connect(t, dsn)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM memory.sessions WHERE id = $1 FOR UPDATE`, sessA); err != nil {
		t.Fatal(err)
	}
	var batchStart time.Time
	done := make(chan error, 1)
	go func() {
		_, err := e.Delete(ctx, req, 100, 0)
		done <- err
	}()
	// The batch's transaction has started and waits on the lock.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := conn.QueryRow(ctx, `SELECT xact_start FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&batchStart)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deletion batch never waited on the lock: %v", err)
		}
	}
	// The backup starts now, by the database's clock, and takes its dump.
	var backupStart time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&backupStart); err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(mustParse(t, dsn).Path, "/")
	file := filepath.Join(t.TempDir(), "during-deletion.dump")
	if err := pg.Dump(name, file); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The backup holds the session...
	restored, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Restore(ctx, restored, file); err != nil {
		t.Fatal(err)
	}
	if n := count(t, connect(t, pg.DSN(restored)), `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 1 {
		t.Fatalf("the dump taken during the deletion holds %d copies of the session, want 1 (the test's premise)", n)
	}
	// ...so the deletion time must come after the backup's start.
	deletedAt, err := e.DeletedAt(ctx, req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if !batchStart.Before(backupStart) {
		t.Fatalf("the backup (%s) did not start after the batch (%s)", backupStart, batchStart)
	}
	if !backupStart.Before(deletedAt) {
		t.Fatalf("deletion time %s is not after the start of a backup that holds the session (%s): that backup would count as clean", deletedAt, backupStart)
	}
}

func mustParse(t *testing.T, dsn string) *url.URL {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
