package erasure

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
// still serves what came back. The step is Done at once (the later steps
// and re-checks go on) with a sooner requeue; the wait says so once, with a
// Warning. The position is the one read after the re-erasure's commit while
// this process remembers it, across passes of the step, else the primary's
// position then. A second restore that takes the receipt back and brings the
// sessions back again has its own wait, though its receipt reuses the batch.
func TestReerasureWaitsForTheReplicasBeforeItsEntry(t *testing.T) {
	replayed := "0/50"
	receipts := map[int]StepReceipt{}
	back := BatchResult{Batch: 4, Sessions: 2, Rows: []Count{{Table: "memory.sessions", Rows: 2}}, LedgerRowsRestored: 2, DeletedAt: dbNow, CommitLSN: "0/A0"}
	f := fakes{ledger: LedgerFns{
		ReeraseFn: func(context.Context, Request) (BatchResult, error) {
			if _, done := receipts[back.Batch]; done {
				return BatchResult{Skipped: true}, nil
			}
			r := reerasureReceipt(back)
			receipts[back.Batch] = r
			return back, nil
		},
		ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) { return receipts, nil },
		PositionFn: func(context.Context) (string, error) { return "0/F0", nil }},
		replicas: func(_ context.Context, lsn string) (bool, error) { return lsn <= replayed, nil }}
	d := &Deletion{Config: testConfig, Waits: &ReplicaWaits{}}
	run := func(ctx context.Context, s *Scope) Outcome { return d.Run(ctx, s) }
	er := completed()
	waits := func(name string, r ran, warned bool) {
		t.Helper()
		if r.out.Kind != Done || r.out.Milestone != nil || r.out.Condition != nil || r.out.RequeueAfter != testConfig.ReplicaRecheck {
			t.Fatalf("%s: %+v; want Done, no entry, no condition change, requeue after %s", name, r.out, testConfig.ReplicaRecheck)
		}
		if w := r.out.Warning; (w != nil) != warned || (warned && w.Reason != lethev1.ReasonReplicaLagging) {
			t.Errorf("%s: warning %+v, want a ReplicaLagging Warning: %t", name, w, warned)
		}
	}

	waits("re-erased, replica at 0/50 behind 0/A0", runFakes(t, run, er, f), true)
	second := runFakes(t, run, er, f)
	waits("still behind", second, false)
	if !slices.Contains(second.calls, "Replicas.CaughtUp(0/A0)") || slices.Contains(second.calls, "Ledger.Position()") {
		t.Errorf("calls %v: want the remembered position 0/A0 asked, not a new one", second.calls)
	}

	// A second restore, while the wait goes on, takes receipt 4 back and
	// brings the sessions back again: the next re-erasure writes batch 4
	// again, later, further on, and is waited for at its own position.
	delete(receipts, back.Batch)
	back.DeletedAt, back.CommitLSN, replayed = dbNow.Add(time.Minute), "0/C0", "0/A8"
	waits("re-erased again, replica at 0/A8 past the first re-erasure, behind 0/C0", runFakes(t, run, er, f), true)

	// A restart forgets the position: the primary's position now is waited for.
	restarted := &Deletion{Config: testConfig, Waits: &ReplicaWaits{}}
	again := runFakes(t, func(ctx context.Context, s *Scope) Outcome { return restarted.Run(ctx, s) }, er, f)
	waits("after a restart", again, true)
	if !slices.Contains(again.calls, "Replicas.CaughtUp(0/F0)") {
		t.Errorf("after a restart: calls %v; want a wait at the primary's position 0/F0", again.calls)
	}
	// A request deleted while it waits leaves nothing remembered.
	uid, of := string(er.UID), receiptOf(receipts[back.Batch])
	if !restarted.Waits.remembers(uid, StepResurrected, of) {
		t.Fatalf("the wait for %s is not remembered: the forget check below cannot fail", of)
	}
	restarted.forgetAll(uid)
	if restarted.Waits.remembers(uid, StepResurrected, of) {
		t.Errorf("the Resurrected wait is still remembered after the request was forgotten")
	}

	replayed = "0/C8"
	caught := runFakes(t, run, er, f)
	if m := caught.out.Milestone; m == nil || m.Event != lethev1.ReasonResurrected || !m.At.Equal(back.DeletedAt) {
		t.Fatalf("caught up: %+v; want the Resurrected entry at the second re-erasure's time", caught.out)
	}
	direct := resurrected(&Scope{Request: er}, reerasureReceipt(back))
	if diff := cmp.Diff(direct.Evidence, caught.out.Evidence); diff != "" {
		t.Errorf("the entry recorded after the wait has other evidence than one recorded at once (-at once +after):\n%s", diff)
	}
	if got := len(caught.er.Status.History); got != len(er.Status.History)+1 {
		t.Errorf("history %d entries, want one more than %d", got, len(er.Status.History))
	}
}
