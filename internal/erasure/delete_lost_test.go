package erasure

import (
	"context"
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
				ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) { return tc.receipts, nil }}}
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
