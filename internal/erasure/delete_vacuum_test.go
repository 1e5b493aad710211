package erasure

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// pendingVacuum is a ledger whose vacuum ends when the test closes end.
type pendingVacuum struct {
	Ledger
	end    chan struct{}
	res    VacuumResult
	err    error
	starts int
}

func (l *pendingVacuum) StartVacuum(_ context.Context, mode lethev1.VacuumMode) *VacuumTicket {
	l.starts++
	return NewVacuumTicket(l.end, func() (VacuumResult, error) { return l.res, l.err })
}

// vacuumPending wires v as the ledger's vacuum.
func vacuumPending(v *pendingVacuum) func(*fakes) {
	return func(f *fakes) {
		f.wrapLedger = func(l Ledger) Ledger { v.Ledger = l; return v }
	}
}

// TestDeletionWaitsForItsVacuumOffThePass: a vacuum that has not ended
// parks the verified deletion (Waiting, woken by the vacuum's end, no
// condition, evidence or milestone yet, the work counted once); a pass
// before the end does nothing; the pass after it completes the step with
// exactly the evidence and milestone a pass that waited would have written.
func TestDeletionWaitsForItsVacuumOffThePass(t *testing.T) {
	claimed := reached(2, withStatusCondition(lethev1.ConditionDeleted, false, lethev1.ReasonDeleting))
	d := &Deletion{Config: testConfig}
	run := func(ctx context.Context, s *Scope) Outcome { return d.Run(ctx, s) }
	v := &pendingVacuum{end: make(chan struct{}), res: VacuumResult{Vacuumed: 9, At: vacuumedAt}}

	first := runFakes(t, run, claimed, deletionFakes(vacuumPending(v), func(f *fakes) { f.claims = ClaimsFns{} }))
	if first.out.Kind != Waiting || first.out.Wake == nil || first.out.RequeueAfter != 0 {
		t.Fatalf("first pass: kind %d, wake %v, requeue %v: want Waiting, woken by the vacuum, no requeue", first.out.Kind, first.out.Wake, first.out.RequeueAfter)
	}
	if first.out.Condition != nil || first.out.Evidence != nil || first.out.Milestone != nil || first.out.Warning != nil {
		t.Errorf("first pass writes %+v: nothing is recorded before the vacuum ends", first.out)
	}
	if diff := cmp.Diff(deleted("grace").Work, first.out.Work); diff != "" {
		t.Errorf("first pass: the deletion's work is counted by the pass that deleted: -want, +got:\n%s", diff)
	}
	if diff := cmp.Diff([]string{deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall}, first.calls); diff != "" {
		t.Errorf("first pass calls: -want, +got:\n%s", diff)
	}

	// Before the end: no port is called (every fake left nil fails the test).
	early := runFakes(t, run, first.er, fakes{})
	if early.out.Kind != Waiting || early.out.Wake != nil || early.out.RequeueAfter != testConfig.RetryAfter || len(early.calls) > 0 {
		t.Fatalf("pass before the vacuum ended: %+v, calls %v: want Waiting on the first pass's wake (a later look as backstop), no call", early.out, early.calls)
	}

	close(v.end)
	select {
	case <-first.out.Wake:
	default:
		t.Fatal("the wake is not closed when the vacuum ended")
	}
	last := runFakes(t, run, early.er, fakes{})
	want := deleted("grace")
	want.Work = Work{}
	if diff := cmp.Diff(want, last.out, cmpopts.IgnoreFields(Outcome{}, "Wake"), persistedSet); diff != "" {
		t.Errorf("pass after the vacuum: -want (a waiting pass's outcome, work counted already), +got:\n%s", diff)
	}
	if len(last.calls) > 0 || v.starts != 1 {
		t.Errorf("pass after the vacuum called %v, %d vacuum(s) started: want none, one", last.calls, v.starts)
	}

	// That pass's status write is refused (a conflict): the next pass, from
	// the same status, verifies again and completes the step again, with no
	// deletion and no second vacuum.
	again := runFakes(t, run, early.er, verifiesOnly(clean))
	if diff := cmp.Diff(want, again.out, cmpopts.IgnoreFields(Outcome{}, "Wake"), persistedSet); diff != "" {
		t.Errorf("pass after a refused write: -want (the same outcome), +got:\n%s", diff)
	}
	if diff := cmp.Diff([]string{verifyNoKeysCall}, again.calls); diff != "" || v.starts != 1 {
		t.Errorf("pass after a refused write: calls -want, +got:\n%s%d vacuum(s) started: want one", diff, v.starts)
	}
	again.out.Persisted()
	if _, kept := d.parked.Load(uid); kept {
		t.Error("the deletion is still parked after the completing outcome was written")
	}
	if _, kept := d.probes.Load(uid); kept {
		t.Error("the sample is still kept after the completing outcome was written")
	}
}

// TestDeletionParkedVacuumFails: a vacuum that failed after it parked the
// deletion is the same Warning as one waited for; the step completes.
func TestDeletionParkedVacuumFails(t *testing.T) {
	claimed := reached(2, withStatusCondition(lethev1.ConditionDeleted, false, lethev1.ReasonDeleting))
	d := &Deletion{Config: testConfig}
	run := func(ctx context.Context, s *Scope) Outcome { return d.Run(ctx, s) }
	v := &pendingVacuum{end: make(chan struct{}), res: VacuumResult{Vacuumed: 2}, err: errors.New("lock timeout")}
	first := runFakes(t, run, claimed, deletionFakes(vacuumPending(v), func(f *fakes) { f.claims = ClaimsFns{} }))
	close(v.end)
	last := runFakes(t, run, first.er, fakes{})
	if last.out.Kind != Done || last.out.Warning == nil || last.out.Warning.Reason != ReasonVacuumIncomplete {
		t.Fatalf("after a failed vacuum: %+v: want Done with a %s warning", last.out, ReasonVacuumIncomplete)
	}
	if last.out.Evidence.VacuumedAt != nil {
		t.Errorf("vacuumedAt %v recorded for a vacuum that failed", last.out.Evidence.VacuumedAt)
	}
}

// TestDeletionForgottenWhileParked: a request forgotten (its finalizer
// ran) while parked leaves nothing kept; a later pass deletes and verifies
// again rather than trusting what it no longer holds.
func TestDeletionForgottenWhileParked(t *testing.T) {
	claimed := reached(2, withStatusCondition(lethev1.ConditionDeleted, false, lethev1.ReasonDeleting))
	d := &Deletion{Config: testConfig}
	run := func(ctx context.Context, s *Scope) Outcome { return d.Run(ctx, s) }
	v := &pendingVacuum{end: make(chan struct{})}
	first := runFakes(t, run, claimed, deletionFakes(vacuumPending(v), func(f *fakes) { f.claims = ClaimsFns{} }))
	d.forget(uid)
	if _, kept := d.parked.Load(uid); kept {
		t.Fatal("forget left the deletion parked")
	}
	again := runFakes(t, run, first.er, deletionFakes(func(f *fakes) { f.claims = ClaimsFns{} }))
	if again.out.Kind != Done || len(again.calls) == 0 || again.calls[0] != deleteCall {
		t.Errorf("pass after forget: kind %d, calls %v: want the deletion run again", again.out.Kind, again.calls)
	}
}

// verifiesOnly is a ledger whose only port is Verify, answering checks.
func verifiesOnly(checks []Verification) fakes {
	return fakes{ledger: LedgerFns{VerifyFn: func(context.Context, Request, ContentKeys) ([]Verification, error) { return checks, nil }}}
}

// TestDeletionParkedAndRefusedVerifiesBeforeCompletingAgain: the pass
// after a refused write verifies again before completing from the parked
// deletion. A failed verification completes nothing. Rows back that the
// re-erasure erases (a restore, even of a dump taken before the request)
// are erased again and recorded as a resurrection, and the next pass
// deletes (skipping), verifies, probes and vacuums anew. Rows
// back that the re-erasure cannot explain send the pass back to the
// deletion: delete, verify and vacuum again.
func TestDeletionParkedAndRefusedVerifiesBeforeCompletingAgain(t *testing.T) {
	claimed := reached(2, withStatusCondition(lethev1.ConditionDeleted, false, lethev1.ReasonDeleting))
	back := []Verification{{Check: "sessions of the request", Found: 1}, {Check: "rows in memory.messages", Found: 12}}
	verifies := func(answers ...[]Verification) func(context.Context, Request, ContentKeys) ([]Verification, error) {
		n := 0
		return func(context.Context, Request, ContentKeys) ([]Verification, error) {
			a := answers[min(n, len(answers)-1)]
			n++
			return a, nil
		}
	}
	// parkedAndHandedOut is a deletion parked, its vacuum ended and its
	// completing outcome handed out once (its write then refused).
	parkedAndHandedOut := func(t *testing.T) (*Deletion, *pendingVacuum, *lethev1.ErasureRequest) {
		d := &Deletion{Config: testConfig}
		v := &pendingVacuum{end: make(chan struct{}), res: VacuumResult{Vacuumed: 9, At: vacuumedAt}}
		first := runFakes(t, d.Run, claimed, deletionFakes(vacuumPending(v), func(f *fakes) { f.claims = ClaimsFns{} }))
		close(v.end)
		if last := runFakes(t, d.Run, first.er, fakes{}); last.out.Kind != Done {
			t.Fatalf("pass after the vacuum: %+v: want Done", last.out)
		}
		return d, v, first.er
	}

	t.Run("verification fails", func(t *testing.T) {
		d, _, er := parkedAndHandedOut(t)
		broken := fakes{ledger: LedgerFns{VerifyFn: func(context.Context, Request, ContentKeys) ([]Verification, error) {
			return nil, errors.New("connection reset")
		}}}
		if out := runFakes(t, d.Run, er, broken).out; out.Kind == Done || out.Condition == nil || out.Condition.OK {
			t.Fatalf("pass whose repeated verification failed: %+v: want a retry, Deleted not True", out)
		}
	})

	t.Run("rows back, erased again", func(t *testing.T) {
		d, v, er := parkedAndHandedOut(t)
		reerased := BatchResult{Sessions: 2, LedgerRowsRestored: 2, Rows: []Count{{Table: "memory.sessions", Rows: 2}}, DeletedAt: vacuumedAt.Add(time.Minute)}
		healed := runFakes(t, d.Run, er, fakes{ledger: LedgerFns{VerifyFn: verifies(back),
			ReeraseFn: func(context.Context, Request) (BatchResult, error) { return reerased, nil }}})
		out := healed.out
		if out.Kind != Waiting || out.Condition == nil || out.Condition.OK || out.Condition.Reason != lethev1.ReasonDeleting ||
			out.Milestone == nil || out.Milestone.Event != lethev1.ReasonResurrected || out.Warning == nil || out.Persisted != nil {
			t.Fatalf("pass that found rows back and erased them again: %+v: want Waiting, Deleted still False (Deleting), a Resurrected entry and warning", out)
		}
		if diff := cmp.Diff([]string{verifyNoKeysCall, reeraseCall}, healed.calls); diff != "" {
			t.Errorf("calls: -want, +got:\n%s", diff)
		}
		// The parked evidence predates the rows' return: the next pass
		// deletes (skipping), verifies, probes and vacuums anew.
		last := runFakes(t, d.Run, healed.er, deletionFakes(vacuumPending(v), func(f *fakes) { f.claims = ClaimsFns{} }))
		if diff := cmp.Diff(deleted("grace"), last.out, cmpopts.IgnoreFields(Outcome{}, "Wake"), persistedSet); diff != "" {
			t.Errorf("pass after the re-erasure: -want (the deletion run again), +got:\n%s", diff)
		}
		if diff := cmp.Diff([]string{deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall}, last.calls); diff != "" {
			t.Errorf("pass after the re-erasure: calls: -want, +got:\n%s", diff)
		}
		if v.starts != 2 {
			t.Errorf("%d vacuums started, want two: the re-erased tuples need a vacuum after them", v.starts)
		}
	})

	t.Run("clean again: the repeated verification is the evidence", func(t *testing.T) {
		d, _, er := parkedAndHandedOut(t)
		again := []Verification{{Check: "sessions of the request (repeated)"}, {Check: "rows in memory.messages (repeated)"}}
		out := runFakes(t, d.Run, er, verifiesOnly(again)).out
		if out.Kind != Done || out.Evidence == nil {
			t.Fatalf("pass whose repeated verification is clean: %+v: want Done", out)
		}
		if diff := cmp.Diff(verifications(again), out.Evidence.Verification); diff != "" {
			t.Errorf("evidence's verification: -want (the repeated one), +got:\n%s", diff)
		}
	})

	t.Run("rows back, not explained", func(t *testing.T) {
		d, v, er := parkedAndHandedOut(t)
		again := runFakes(t, d.Run, er, deletionFakes(vacuumPending(v), func(f *fakes) {
			f.claims = ClaimsFns{}
			f.ledger.VerifyFn = verifies(back, clean)
			f.ledger.ReeraseFn = func(context.Context, Request) (BatchResult, error) { return BatchResult{Skipped: true}, nil }
		}))
		if again.out.Kind != Done {
			t.Fatalf("pass that found rows back: %+v: want the deletion run again to Done", again.out)
		}
		if len(again.calls) < 3 || again.calls[0] != verifyNoKeysCall || again.calls[1] != reeraseCall || again.calls[2] != deleteCall || v.starts != 2 {
			t.Errorf("pass that found rows back: calls %v, %d vacuum(s) started: want verify, re-erase, then delete again, a second vacuum", again.calls, v.starts)
		}
	})
}
