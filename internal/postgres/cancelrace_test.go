package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// Two overlapping requests are cancelled at the same moment. The worst
// point: the cancel of the request holding the shared tombstone has handed
// it to the other request and not committed yet, while the other's cancel
// runs from start to end. The tombstone must not end up held by a
// cancelled request (a soft delete nobody ends): one of the cancels lifts it.
func TestConcurrentCancelsOfOverlappingRequestsLiftTheSharedTombstone(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	a := erasure.Request{UID: "uid-first", SessionIDs: []string{sessA}, Grace: time.Hour}
	b := erasure.Request{UID: "uid-second", SessionIDs: []string{sessA, sessB}, Grace: time.Hour}
	for _, r := range []erasure.Request{a, b} {
		if _, err := e.Tombstone(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var holder string
	if err := conn.QueryRow(ctx, `SELECT tombstoned_by FROM memory.sessions WHERE id = $1`, sessA).Scan(&holder); err != nil || holder != a.UID {
		t.Fatalf("the shared session is tombstoned by %q (%v), want the first request", holder, err)
	}

	// The test holds the first cancel's receipt key: its INSERT, its last
	// statement, waits there — after the hand-over, before the commit.
	gate := connect(t, dsn)
	tx, err := gate.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO lethe.erasure_receipts (request_uid, step, batch, digest) VALUES ($1, $2, 0, 'gate')`,
		a.UID, erasure.StepCancelled); err != nil {
		t.Fatal(err)
	}
	firstDone := make(chan error, 1)
	go func() {
		_, err := e.Cancel(ctx, a.UID)
		firstDone <- err
	}()
	waitForLock(t, conn, "%erasure_receipts%")
	secondDone := make(chan error, 1)
	go func() {
		_, err := e.Cancel(ctx, b.UID)
		secondDone <- err
	}()
	// Give the second cancel time to run to its end, or to wait on the first.
	select {
	case err := <-secondDone:
		secondDone <- err
	case <-time.After(2 * time.Second):
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{firstDone, secondDone} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	var tombstoned int64
	var by *string
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE tombstoned_at IS NOT NULL), max(tombstoned_by) FROM memory.sessions WHERE id = ANY($1::uuid[])`,
		[]string{sessA, sessB}).Scan(&tombstoned, &by); err != nil {
		t.Fatal(err)
	}
	if tombstoned != 0 {
		t.Fatalf("%d session(s) still tombstoned (by %v) after both requests were cancelled", tombstoned, *by)
	}
}

// waitForLock waits until another backend waits on a lock while running a
// statement like pattern.
func waitForLock(t *testing.T, conn *pgx.Conn, pattern string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if count(t, conn, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1 AND pid <> pg_backend_pid()`, pattern) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement like %q waited on a lock", pattern)
		}
	}
}
