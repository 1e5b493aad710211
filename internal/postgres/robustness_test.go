package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// seedTiny writes n small sessions (a round and a fact each) for tenant t1 and
// returns their IDs.
func seedTiny(t *testing.T, conn *pgx.Conn, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-0000-4000-8000-%012d", prefix, i)
	}
	mustExec(t, conn, `INSERT INTO memory.sessions (id, tenant_id) SELECT id, 't1' FROM unnest($1::uuid[]) id`, ids)
	mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text) SELECT id, 0, 'x' FROM unnest($1::uuid[]) id`, ids)
	mustExec(t, conn, `INSERT INTO memory.facts (session_id, kind, content) SELECT id, 'learning', 'x' FROM unnest($1::uuid[]) id`, ids)
	return ids
}

// Two managers at once (or one with a stale cache) run the same deletion:
// the ledger guard lets exactly one delete each session, and each receipt is
// written once (target R5).
func TestTwoManagersDeletingAtOnceDeleteOnce(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	ids := seedTiny(t, conn, "aaaaaaaa", 20)
	keep := seedTiny(t, conn, "bbbbbbbb", 5)
	a, b := eraser(t, dsn, "t1"), eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-r5", SessionIDs: ids}
	if _, err := a.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		var wg sync.WaitGroup
		results := make([]erasure.DeleteResult, 2)
		errs := make([]error, 2)
		for i, e := range []*postgres.Eraser{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = e.Delete(ctx, req, 3, 0)
			}()
		}
		wg.Wait()
		deleted := 0
		for i := range results {
			if errs[i] != nil {
				t.Fatalf("manager %d: %v", i, errs[i])
			}
			for _, bt := range results[i].Batches {
				deleted += bt.Sessions
			}
		}
		if want := map[bool]int{true: len(ids), false: 0}[round == 0]; deleted != want {
			t.Fatalf("round %d: the two managers deleted %d sessions together, want %d", round, deleted, want)
		}
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = 'uid-r5' AND step = 'Deleted'`); n != 7 {
		t.Errorf("deletion receipts: %d, want 7 (one per batch of 3 for 20 sessions)", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, keep); n != int64(len(keep)) {
		t.Errorf("sessions outside the request: %d left of %d", n, len(keep))
	}
}

// Cancel and the grace expiry race, many times: when cancel wins nothing is
// deleted; never both cancelled and deleted (target R2).
func TestCancelAndDeleteRace(t *testing.T) {
	const trials = 1000
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	ids := seedTiny(t, conn, "cccccccc", trials)
	a, b := eraser(t, dsn, ""), eraser(t, dsn, "")
	rng := rand.New(rand.NewPCG(3, 4))
	cancelWins, deleteWins := 0, 0
	for i, id := range ids {
		uid := fmt.Sprintf("uid-race-%d", i)
		req := erasure.Request{UID: uid, SessionIDs: []string{id}} // grace 0: expiry is "now"
		if _, err := a.Tombstone(ctx, req); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var cancelErr, deleteErr error
		var del erasure.DeleteResult
		wg.Add(2)
		// A random head start for the cancel (up to 20 ms: a delete takes a
		// few ms to reach its guard), so that both orders happen.
		jitter := time.Duration(rng.IntN(20000)) * time.Microsecond
		go func() { defer wg.Done(); time.Sleep(jitter); _, cancelErr = a.Cancel(ctx, uid) }()
		go func() { defer wg.Done(); del, deleteErr = b.Delete(ctx, req, 10, 0) }()
		wg.Wait()
		if deleteErr != nil {
			t.Fatalf("trial %d: delete: %v", i, deleteErr)
		}
		exists := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, id) == 1
		cancelled := cancelErr == nil
		switch {
		case cancelled && !errors.Is(cancelErr, erasure.ErrTooLateToCancel) && exists && del.Batches[0].Skipped:
			cancelWins++
		case errors.Is(cancelErr, erasure.ErrTooLateToCancel) && !exists && del.Batches[0].Sessions == 1:
			deleteWins++
		default:
			t.Fatalf("trial %d: cancel err %v, session exists %v, delete %+v: neither outcome is clean", i, cancelErr, exists, del.Batches)
		}
		if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND erased_at IS NOT NULL AND cancelled_at IS NOT NULL`, uid); n != 0 {
			t.Fatalf("trial %d: ledger rows both erased and cancelled", i)
		}
	}
	t.Logf("%d trials: cancel won %d, delete won %d", trials, cancelWins, deleteWins)
	if cancelWins+deleteWins != trials || cancelWins == 0 || deleteWins == 0 {
		t.Fatalf("outcomes: cancel %d, delete %d of %d: both orders must have happened for the race to be tested", cancelWins, deleteWins, trials)
	}
}

// The deletion is interrupted at random points — between batches and inside
// the transaction (the connection's context is cancelled, as a killed
// manager or a dropped connection would) — then run again until it
// completes. Nothing outside the request is deleted and every receipt exists
// exactly once (target R1, at the database layer).
func TestInterruptedDeletionCompletesWithOneReceiptPerBatch(t *testing.T) {
	const runs = 100
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	keep := seedTiny(t, conn, "dddddddd", 10)
	e := eraser(t, dsn, "t1")
	rng := rand.New(rand.NewPCG(1, 2))
	interrupted := 0
	for run := 0; run < runs; run++ {
		ids := seedTiny(t, conn, fmt.Sprintf("e%07d", run), 7)
		uid := fmt.Sprintf("uid-r1-%d", run)
		req := erasure.Request{UID: uid, SessionIDs: ids}
		var lastT, lastD error
		for attempt := 0; ; attempt++ {
			if attempt > 50 {
				t.Fatalf("run %d did not complete after 50 attempts; last errors: %v / %v", run, lastT, lastD)
			}
			// A random cut-off, doubling with each attempt (up to 30 s) so
			// every run ends however loaded the machine is.
			window := min(5000<<min(attempt, 13), 30_000_000)
			actx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(window))*time.Microsecond)
			_, terr := e.Tombstone(actx, req)
			var derr error
			if terr == nil {
				_, derr = e.Delete(actx, req, 2, 0)
			}
			cancel()
			if terr == nil && derr == nil {
				break
			}
			lastT, lastD = terr, derr
			interrupted++
		}
		if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, ids); n != 0 {
			t.Fatalf("run %d: %d sessions left", run, n)
		}
		if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, uid); n != 4 {
			t.Fatalf("run %d: %d deletion receipts, want 4 (7 sessions in batches of 2)", run, n)
		}
		if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Tombstoned'`, uid); n != 1 {
			t.Fatalf("run %d: %d tombstone receipts, want 1", run, n)
		}
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, keep); n != int64(len(keep)) {
		t.Errorf("sessions outside the requests: %d left of %d", n, len(keep))
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.rounds WHERE session_id = ANY($1::uuid[])`, keep); n != int64(len(keep)) {
		t.Errorf("rounds outside the requests: %d left of %d", n, len(keep))
	}
	t.Logf("%d runs, %d interrupted attempts", runs, interrupted)
	if interrupted < runs/2 {
		t.Fatalf("only %d attempts were interrupted: the faults did not reach the transactions", interrupted)
	}
}
