package erasure

import (
	"context"
	"fmt"
	"slices"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// The Deleted step ends with a vacuum of the tables the deletion touched:
// a deleted tuple stays readable from the data files until then. A vacuum
// reads every index of those tables, seconds to minutes on large ones, and
// a store's deletions share one vacuum at a time (the Ledger coalesces
// them). So a pass does not wait for it: it starts (joins) the vacuum,
// keeps the verified evidence in memory and returns Waiting, woken when the
// vacuum ends; the pass that finds it ended completes the step. Meanwhile
// the worker serves other requests, whose deletions join the same next
// vacuum. A process without the ticket (restarted, a new leader) deletes
// again (every batch is skipped), verifies again and vacuums again.

// parkedDeletion is a deletion verified and waiting for its vacuum.
type parkedDeletion struct {
	mode   lethev1.VacuumMode
	ticket *VacuumTicket
	ev     lethev1.StepEvidence
	// handedOut is set once a completing outcome was returned: a pass that
	// finds it set follows one whose status write was refused.
	handedOut bool
}

// vacuumThenDone starts the vacuum as the store says and completes the
// step if it has already ended; else it parks the deletion.
func (d *Deletion) vacuumThenDone(ctx context.Context, s *Scope, ev lethev1.StepEvidence, work Work) Outcome {
	mode := s.Store.Spec.Postgres.VacuumOrDefault()
	if mode == lethev1.VacuumOff {
		return d.deleted(s.uid(), ev, work, nil)
	}
	p := &parkedDeletion{mode: mode, ticket: s.Ledger.StartVacuum(ctx, mode), ev: ev}
	// Kept until the completing outcome is written (Outcome.Persisted), even
	// when the vacuum has already ended.
	d.parked.Store(s.uid(), p)
	if p.ticket.Ended() {
		return p.done(d, s.uid(), work)
	}
	return Outcome{Kind: Waiting, Work: work, Wake: p.ticket.Done()}
}

// unpark completes the request's parked deletion once its vacuum has
// ended; parked is false when none is parked (or it was dropped: the pass
// then deletes and verifies again). The deletion stays parked until the
// completing outcome is written: a pass whose write is refused is followed
// by one that completes it again without deleting and vacuuming again, but
// only after verifying again that nothing of the sessions is back — that
// pass can come long after the verification (behind the whole queue), time
// in which a restore or a late write could have brought rows back.
func (d *Deletion) unpark(ctx context.Context, s *Scope) (out Outcome, parked bool) {
	v, ok := d.parked.Load(s.uid())
	if !ok {
		return Outcome{}, false
	}
	p := v.(*parkedDeletion)
	if !p.ticket.Ended() {
		// The pass that parked it is woken when the vacuum ends; this one
		// (another event came) looks again later in case that wake is lost,
		// and asks for no second wake: one wait, one pass.
		return Outcome{Kind: Waiting, RequeueAfter: d.Config.RetryAfter}, true
	}
	if p.handedOut {
		// The content keys were not kept: a parked deletion would hold them
		// until its vacuum ends, and this pass is rare.
		checks, err := s.Ledger.Verify(ctx, FoundRequest(s.Request), nil)
		if err != nil {
			return failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonDeleting,
				"deleted and verified; the verification repeated before completing failed and is retried", err), true
		}
		if slices.ContainsFunc(checks, func(c Verification) bool { return c.Found > 0 }) {
			return d.backBeforeRecorded(ctx, s)
		}
		p.ev.Verification = verifications(checks)
	}
	// The work was counted by the pass that deleted.
	return p.done(d, s.uid(), Work{}), true
}

// backBeforeRecorded handles rows of the sessions found back after the
// deletion was verified but before it was recorded (a restore, possibly of
// a dump taken before the request: no ledger row left for Delete to act
// on). As once the step is recorded, the re-erasure erases them again,
// puts the ledger back and records the resurrection. The parked evidence
// is then dropped either way: it describes a verification, residue probe
// and vacuum from before the rows came back, and the re-erased tuples are
// in the data files until a vacuum after them. So the next pass runs the
// deletion again (every batch skipped once the ledger is back), which
// verifies, probes and vacuums anew. What the re-erasure cannot explain
// goes to the deletion in this pass, which deletes, verifies (and stalls,
// saying so, on what is still found) and vacuums again.
func (d *Deletion) backBeforeRecorded(ctx context.Context, s *Scope) (Outcome, bool) {
	return d.reeraseThenAgain(ctx, s, "deleted and verified; rows of the sessions came back before the step was recorded")
}

// reeraseThenAgain erases again what came back of the request's sessions
// (what says why, counts-free) and drops any parked deletion; when the
// re-erasure did something, the outcome records the resurrection and has
// the next pass delete (every batch skipped), verify, probe and vacuum
// again. erased is false when nothing came back that the re-erasure could
// act on: the caller goes on with the deletion.
func (d *Deletion) reeraseThenAgain(ctx context.Context, s *Scope, what string) (out Outcome, erased bool) {
	res, err := s.Ledger.Reerase(ctx, FoundRequest(s.Request))
	if err != nil {
		return failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonDeleting, what+"; their re-erasure failed: retried", err), true
	}
	d.parked.Delete(s.uid())
	if !reerasedAnything(res) {
		return Outcome{}, false
	}
	// The replicas must replay the re-erasure too: a position remembered
	// from before it is not enough.
	d.Waits.forget(s.uid(), lethev1.ConditionDeleted)
	out = resurrected(s, reerasureReceipt(res))
	out.Kind, out.RequeueAfter = Waiting, time.Second
	out.Condition = condition(lethev1.ConditionDeleted, false, lethev1.ReasonDeleting,
		what+" and were erased again: deleting, verifying and vacuuming again")
	return out, true
}

// done completes the step with the vacuum's result in its evidence.
func (p *parkedDeletion) done(d *Deletion, uid string, work Work) Outcome {
	p.handedOut = true
	ev := p.ev
	res, err := p.ticket.Result()
	warning := vacuumEvidence(p.mode, res, err, &ev)
	return d.deleted(uid, ev, work, warning)
}

// deleted is the step's Done outcome.
func (d *Deletion) deleted(uid string, ev lethev1.StepEvidence, work Work, warning *Warning) Outcome {
	out := done(lethev1.ConditionDeleted, lethev1.ReasonSessionsDeleted,
		"the sessions, every row cascading from them, their content-keyed entries and derived records are deleted and verified absent")
	out.Evidence = &ev
	out.Milestone = &Milestone{Phase: lethev1.PhaseDeleted, At: ev.CompletedAt.Time, Evidence: ev, Note: ev.Note}
	out.Work, out.Warning = work, warning
	out.Persisted = func() { d.forget(uid) }
	return out
}

// vacuumEvidence records in ev what the vacuum did: when, and how many
// tables it could and could not vacuum. A vacuum that failed or could not
// vacuum every table is a warning, not a stop: the graph and the backups
// still hold the erased data and come next; autovacuum removes the tuples
// later.
func vacuumEvidence(mode lethev1.VacuumMode, v VacuumResult, err error, ev *lethev1.StepEvidence) *Warning {
	if err != nil {
		ev.Counts = append(ev.Counts, lethev1.TableCount{Table: CountTablesVacuumed + " (" + string(mode) + ", failed)", Rows: int64(v.Vacuumed)})
		return &Warning{Reason: ReasonVacuumIncomplete, Action: "Vacuum",
			Note: fmt.Sprintf("the vacuum after the deletion failed after %d table(s); the erased tuples stay in the data files until autovacuum removes them", v.Vacuumed)}
	}
	ev.Counts = append(ev.Counts, lethev1.TableCount{Table: CountTablesVacuumed + " (" + string(mode) + ")", Rows: int64(v.Vacuumed)})
	if v.Vacuumed > 0 {
		ev.VacuumedAt = mtime(v.At)
	}
	if v.NotPermitted == 0 {
		return nil
	}
	ev.Counts = append(ev.Counts, lethev1.TableCount{Table: CountTablesNotVacuumed, Rows: int64(v.NotPermitted)})
	return &Warning{Reason: ReasonVacuumIncomplete, Action: "Vacuum",
		Note: fmt.Sprintf("%d table(s) not vacuumed: the manager's role neither owns them nor holds MAINTAIN; the erased tuples stay in their data files until autovacuum removes them", v.NotPermitted)}
}
