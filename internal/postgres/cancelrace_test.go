package postgres_test

import (
	"context"
	"errors"
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

// A request is cancelled while a pass that read it before the cancel is
// tombstoning its sessions. The worst point: the tombstone's transaction
// has begun and waits for a session's lock (a derivation in flight holds
// it) while the cancel, which finds no ledger row yet, runs. Whichever
// order they commit in, no session may stay tombstoned by a cancelled
// request, and no ledger row of it may stay in force. A tombstone that
// starts after the cancel refuses (ErrCancelled) and touches nothing.
func TestCancelDuringTheTombstoneLeavesNothingHidden(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-cancelled-mid-tombstone", SessionIDs: []string{sessA}, Grace: time.Hour}

	derivation := connect(t, dsn)
	if _, err := derivation.Exec(ctx, `SELECT pg_advisory_lock(hashtext('lethe.session'), hashtext($1::text))`, sessA); err != nil {
		t.Fatal(err)
	}
	tombstoned := make(chan error, 1)
	go func() {
		_, err := e.Tombstone(ctx, req)
		tombstoned <- err
	}()
	waitForLock(t, conn, "%lethe.session%")
	cancelled := make(chan error, 1)
	go func() {
		_, err := e.Cancel(ctx, req.UID)
		cancelled <- err
	}()
	// The cancel runs to its end, or waits for the tombstone's transaction
	// (then two backends wait on locks: the tombstone and the cancel).
	for deadline := time.Now().Add(20 * time.Second); len(cancelled) == 0; time.Sleep(10 * time.Millisecond) {
		if count(t, conn, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()`) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancel neither ended nor waited on a lock")
		}
	}
	if _, err := derivation.Exec(ctx, `SELECT pg_advisory_unlock(hashtext('lethe.session'), hashtext($1::text))`, sessA); err != nil {
		t.Fatal(err)
	}
	if err := <-tombstoned; err != nil && !errors.Is(err, erasure.ErrCancelled) {
		t.Fatalf("tombstone: %v", err)
	}
	if err := <-cancelled; err != nil {
		t.Fatalf("cancel: %v", err)
	}
	assertNothingHidden(t, conn, req)

	// A tombstone that starts once the cancel committed refuses.
	if _, err := e.Tombstone(ctx, req); !errors.Is(err, erasure.ErrCancelled) {
		t.Fatalf("a tombstone after the cancel: %v, want ErrCancelled", err)
	}
	assertNothingHidden(t, conn, req)
}

// assertNothingHidden checks that none of req's sessions is tombstoned and
// that none of its ledger rows is in force, under its Cancelled receipt.
func assertNothingHidden(t *testing.T, conn *pgx.Conn, req erasure.Request) {
	t.Helper()
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[]) AND tombstoned_at IS NOT NULL`, req.SessionIDs); n != 0 {
		t.Errorf("%d session(s) tombstoned after their request was cancelled", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND erased_at IS NULL AND cancelled_at IS NULL`, req.UID); n != 0 {
		t.Errorf("%d ledger row(s) of the cancelled request in force", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = $2`, req.UID, erasure.StepCancelled); n != 1 {
		t.Errorf("%d Cancelled receipts, want 1", n)
	}
}
