package erasure

import (
	"context"
	"slices"
	"testing"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// withResurrected appends a Resurrected entry at each time, as a graph or
// Backups re-check, or a re-erasure, would have recorded it.
func withResurrected(er *lethev1.ErasureRequest, at ...time.Time) *lethev1.ErasureRequest {
	for _, t := range at {
		ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: mtime(t), Note: "earlier"}
		Record(er, Outcome{Kind: Done, Evidence: &ev,
			Milestone: &Milestone{Phase: er.Status.Phase, Event: lethev1.ReasonResurrected, At: t, Evidence: ev}}, t, nil)
	}
	return er
}

// TestDeletionReverifyMatchesLostEntriesByTime: a Resurrected receipt
// stands for its history entry by its time, not by a count. Entries the
// graph's or the Backups' re-check recorded (no receipt here), and receipts
// a restore took back with the database, must neither hide a re-erasure
// whose status write was lost nor have one recorded twice.
func TestDeletionReverifyMatchesLostEntriesByTime(t *testing.T) {
	t1, t2, t3 := dbNow.Add(-2*time.Hour), dbNow.Add(-time.Hour), dbNow
	dated := func(batch int, at time.Time) StepReceipt {
		return StepReceipt{Batch: batch, Sessions: 1, Counts: map[string]int64{"memory.sessions": 1}, At: at}
	}
	cases := map[string]struct {
		er       *lethev1.ErasureRequest
		receipts map[int]StepReceipt
		want     time.Time // the lost receipt's time; zero: nothing lost
	}{
		"AGraphEntryIsNotTheReerasure": {er: withResurrected(completed(), t1),
			receipts: map[int]StepReceipt{0: dated(0, t2)}, want: t2},
		"ARestoreTookEarlierReceipts": {er: withResurrected(completed(), t1, t2),
			receipts: map[int]StepReceipt{2: dated(2, t3)}, want: t3},
		"TheRestoredReceiptHasItsEntry": {er: withResurrected(completed(), t1, t2),
			receipts: map[int]StepReceipt{0: dated(0, t1)}},
		"EveryReceiptHasItsEntry": {er: withResurrected(completed(), t1, t2),
			receipts: map[int]StepReceipt{0: dated(0, t1), 1: dated(1, t2)}},
		"TwoInOneSecondNeedTwoEntries": {er: withResurrected(completed(), t2),
			receipts: map[int]StepReceipt{0: dated(0, t2), 1: dated(1, t2.Add(300*time.Millisecond))}, want: t2.Add(300 * time.Millisecond)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := fakes{ledger: LedgerFns{ReeraseFn: func(context.Context, Request) (BatchResult, error) { return BatchResult{Skipped: true}, nil },
				ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) { return tc.receipts, nil },
				PositionFn: func(context.Context) (string, error) { return "0/3000060", nil }},
				replicas: func(context.Context, string) (bool, error) { return true, nil }}
			first := runFakes(t, reverifyDeletion, tc.er, f)
			if tc.want.IsZero() {
				if first.out.Milestone != nil {
					t.Fatalf("every receipt has its entry, yet %+v was recorded", first.out.Milestone)
				}
				return
			}
			if m := first.out.Milestone; m == nil || m.Event != lethev1.ReasonResurrected || !m.At.Equal(tc.want) {
				t.Fatalf("milestone %+v, want the lost re-erasure's Resurrected entry at its receipt's time %v", first.out.Milestone, tc.want)
			}
			if again := runFakes(t, reverifyDeletion, first.er, f); again.out.Milestone != nil {
				t.Errorf("the lost entry was recorded twice: %+v", again.out.Milestone)
			}
		})
	}
}

// TestReerasureWaitsForTheReplicasBeforeItsEntry: a re-erasure after the
// deletion (a restore brought sessions back) is recorded once every replica
// replayed it, as the grace period's re-tombstone is: until then a replica
// still serves what came back. The request's conditions stay as they are;
// the wait says so once, with a Warning. The position is the one read after
// the re-erasure's commit while this process remembers it, else the
// primary's position then.
func TestReerasureWaitsForTheReplicasBeforeItsEntry(t *testing.T) {
	replayed := "0/50"
	receipts := map[int]StepReceipt{}
	back := BatchResult{Batch: 4, Sessions: 2, Rows: []Count{{Table: "memory.sessions", Rows: 2}}, DeletedAt: dbNow, CommitLSN: "0/A0"}
	f := fakes{ledger: LedgerFns{
		ReeraseFn: func(context.Context, Request) (BatchResult, error) {
			if _, done := receipts[4]; done {
				return BatchResult{Skipped: true}, nil
			}
			receipts[4] = StepReceipt{Batch: 4, Sessions: 2, Counts: map[string]int64{"memory.sessions": 2}, At: dbNow}
			return back, nil
		},
		ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) { return receipts, nil },
		PositionFn: func(context.Context) (string, error) { return "0/F0", nil }},
		replicas: func(_ context.Context, lsn string) (bool, error) { return lsn <= replayed, nil }}
	d := &Deletion{Config: testConfig, Waits: &ReplicaWaits{}}
	reverify := func(ctx context.Context, s *Scope) Outcome { return d.Reverify(ctx, s) }
	er := completed()

	first := runFakes(t, reverify, er, f)
	if first.out.Kind != Waiting || first.out.Milestone != nil || first.out.Condition != nil {
		t.Fatalf("re-erased, replica at %s behind 0/A0: %+v; want Waiting, no entry, no condition change", replayed, first.out)
	}
	if w := first.out.Warning; w == nil || w.Reason != lethev1.ReasonReplicaLagging {
		t.Errorf("warning %+v, want ReplicaLagging", first.out.Warning)
	}
	second := runFakes(t, reverify, er, f)
	if second.out.Kind != Waiting || second.out.Milestone != nil || second.out.Warning != nil {
		t.Errorf("still behind: %+v; want Waiting, no entry and no second Warning", second.out)
	}
	if !slices.Contains(second.calls, "Replicas.CaughtUp(0/A0)") || slices.Contains(second.calls, "Ledger.Position()") {
		t.Errorf("calls %v: want the remembered position 0/A0 asked, not a new one", second.calls)
	}

	replayed = "0/A8"
	third := runFakes(t, reverify, er, f)
	if m := third.out.Milestone; m == nil || m.Event != lethev1.ReasonResurrected || !m.At.Equal(dbNow) {
		t.Fatalf("caught up: %+v; want the Resurrected entry at the re-erasure's time", third.out)
	}
	if got := len(third.er.Status.History); got != len(er.Status.History)+1 {
		t.Errorf("history %d entries, want one more than %d", got, len(er.Status.History))
	}

	// A restart forgets the position: the primary's position now is waited for.
	restarted := &Deletion{Config: testConfig, Waits: &ReplicaWaits{}}
	again := runFakes(t, func(ctx context.Context, s *Scope) Outcome { return restarted.Reverify(ctx, s) }, er, f)
	if again.out.Kind != Waiting || again.out.Milestone != nil || !slices.Contains(again.calls, "Replicas.CaughtUp(0/F0)") {
		t.Errorf("after a restart: %+v, calls %v; want a wait at the primary's position 0/F0", again.out, again.calls)
	}

	// A request deleted while it waits leaves nothing remembered.
	uid := string(er.UID)
	if !restarted.Waits.remembers(uid, StepResurrected, "receipt 4") {
		t.Fatalf("the wait for receipt 4 is not remembered: the forget check below cannot fail")
	}
	restarted.forget(uid)
	if restarted.Waits.remembers(uid, StepResurrected, "receipt 4") {
		t.Errorf("the Resurrected wait is still remembered after the request was forgotten")
	}
}
