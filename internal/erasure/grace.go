package erasure

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// GraceWait is step 2: it waits out the grace period by the database's
// clock; spec.cancel lifts the tombstones; spec.immediate skips the wait.
type GraceWait struct {
	Config Config
	// Waits remembers the position the replicas must replay (nil: none).
	Waits *ReplicaWaits
}

// Name is the step's condition type.
func (GraceWait) Name() string { return lethev1.ConditionGracePeriodElapsed }

func (g GraceWait) Run(ctx context.Context, s *Scope) Outcome {
	er := s.Request
	if s.isTrue(lethev1.ConditionGracePeriodElapsed) {
		return Outcome{Kind: Done}
	}
	if er.Spec.Cancel {
		// Too late (the deletion had started) goes on as if not cancelled.
		if out, ok := cancel(ctx, s, g.Config); ok {
			return out
		}
	}
	if er.Spec.Immediate {
		out := done(lethev1.ConditionGracePeriodElapsed, lethev1.ReasonImmediate, "spec.immediate skips the grace period; spec.reason says why")
		out.Milestone = &Milestone{Phase: lethev1.PhaseGracePeriod, Event: lethev1.ReasonImmediate, At: s.Clock.Now(),
			Evidence: reasonEvidence(er.Spec.Reason), Note: "grace period skipped (immediate)"}
		return out
	}
	gs, err := s.Ledger.Grace(ctx, s.uid())
	if err != nil {
		return failed(g.Config, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonDatabaseUnavailable,
			"the database clock could not be read; Lethe retries", err)
	}
	end, lost := recordedEnd(er, gs)
	again := lost || tombstonedAgain(er, gs)
	// After a re-tombstone whose record is missing (the replicas lagged, a
	// status write was refused), its repeat records it, after the recorded
	// end too.
	if lost && gs.Now.Before(end) || again && !lost && !resurrectionRecorded(er, gs.TombstonedAt) {
		return g.tombstoneAgain(ctx, s, gs, end)
	}
	// The status keeps the end the request recorded; after a re-tombstone
	// the ledger's end is a little later (tombstoneAgain).
	statusEnd := gs.GraceEndsAt
	if again {
		statusEnd = end
	}
	if !gs.Elapsed {
		// Requeue at the right time by the database's clock; never sleep.
		out := waiting(gs.GraceEndsAt.Sub(gs.Now)+time.Second, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace,
			"waiting until status.graceEndsAt by the database's clock; set spec.cancel to undo")
		out.GraceEndsAt = &statusEnd
		return out
	}
	out := done(lethev1.ConditionGracePeriodElapsed, lethev1.ReasonGraceElapsed, "the grace period has elapsed by the database's clock")
	gs.GraceEndsAt = statusEnd
	out.GraceEndsAt = &gs.GraceEndsAt
	out.Milestone = &Milestone{Phase: lethev1.PhaseGracePeriod, At: gs.Now,
		Evidence: map[string]string{"graceEndsAt": gs.GraceEndsAt.UTC().Format(time.RFC3339)}, Note: "grace period elapsed"}
	return out
}

// cancel lifts the tombstones and ends the request as Cancelled. ok is
// false when the deletion has started: the cancel is then too late and
// ignored.
func cancel(ctx context.Context, s *Scope, cfg Config) (out Outcome, ok bool) {
	c, err := s.Ledger.Cancel(ctx, s.uid())
	if errors.Is(err, ErrTooLateToCancel) {
		return Outcome{}, false
	}
	if err != nil {
		return failed(cfg, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonDatabaseUnavailable,
			"the cancel could not be written; Lethe retries", err), true
	}
	return Outcome{Kind: Ended,
		Condition: condition(lethev1.ConditionGracePeriodElapsed, false, lethev1.ReasonCancelled, "spec.cancel: the tombstones were lifted before deletion"),
		Evidence: &lethev1.StepEvidence{Step: lethev1.ReasonCancelled, CompletedAt: mtime(c.At),
			Note: fmt.Sprintf("%d tombstone(s) lifted; the ledger marks the request cancelled", c.Lifted)},
		Milestone: &Milestone{Phase: lethev1.PhaseCancelled, At: c.At, Evidence: map[string]int64{"tombstonesLifted": c.Lifted},
			Note: "cancelled: tombstones lifted"},
	}, true
}

// reasonEvidence stands for spec.reason in the history: a digest and a
// length, never the text (free text a person typed may name anyone).
func reasonEvidence(reason string) map[string]any {
	sum := sha256.Sum256([]byte(reason))
	return map[string]any{"reasonSha256": hex.EncodeToString(sum[:]), "reasonLength": len(reason)}
}

// tombstoneAgain answers a restore that took the request's ledger rows and
// tombstones (a dump taken before the request): the sessions it found are
// readable again, and nothing refuses a derivation from them. They are
// tombstoned again, their ledger rows ending the grace period just after
// the end the request recorded (retombstoneMargin), so that they are hidden
// and guarded again and the undo holds until then.
//
// Like the first tombstone, the resurrection is recorded only once every
// replica has replayed it. Until then, and after a status write that was
// refused, later passes come back here (tombstonedAgain) and repeat the
// tombstone, which then changes nothing and reports the first run's
// readings, until the history holds the entry.
func (g GraceWait) tombstoneAgain(ctx context.Context, s *Scope, gs GraceState, end time.Time) Outcome {
	req := FoundRequest(s.Request)
	// A repeat keeps the first run's grace period; a floor for a repeat
	// after the recorded end.
	req.Grace = max(end.Add(retombstoneMargin).Sub(gs.Now), retombstoneMargin)
	plan, err := s.Ledger.Tombstone(ctx, req)
	if errors.Is(err, ErrCancelled) {
		return cancelledInTheDatabase(g.Config, lethev1.ConditionGracePeriodElapsed)
	}
	if err != nil {
		return failed(g.Config, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonDatabaseUnavailable,
			"the database holds no ledger row of the request (restored from before it?); tombstoning its sessions again failed: retried", err)
	}
	if len(plan.Found) == 0 {
		// The dump predates the sessions too: nothing came back to hide. Or
		// a restore is still loading them: look again soon.
		return waiting(min(req.Grace+time.Second, g.Config.RetryAfter), lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace,
			"waiting until status.graceEndsAt by the database's clock; the database holds neither the request's ledger rows nor its sessions (a restore)")
	}
	caughtUp, err := g.Waits.caughtUp(ctx, s, lethev1.ConditionGracePeriodElapsed, plan.CommitLSN, tombstoneOf(plan))
	switch {
	case err != nil:
		return failed(g.Config, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonReplicaLagging,
			"the sessions, back after a restore, are tombstoned again on the primary; a replica could not be asked whether it replayed that and is retried", err)
	case !caughtUp:
		return waiting(g.Config.ReplicaRecheck, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonReplicaLagging,
			"the sessions, back after a restore, are tombstoned again on the primary; waiting for every replica to replay it (until then a replica serves them)")
	}
	note := fmt.Sprintf("a restore of the database took the request's ledger rows and tombstones; %d session(s) tombstoned again until the recorded end of the grace period", len(plan.Found))
	out := waiting(max(plan.GraceEndsAt.Sub(gs.Now), 0)+time.Second, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace,
		"waiting until status.graceEndsAt by the database's clock; the database had lost the request's ledger rows and tombstones (a restore): its sessions are tombstoned again; set spec.cancel to undo")
	out.Milestone = &Milestone{Phase: s.Request.Status.Phase, Event: lethev1.ReasonResurrected, At: plan.TombstonedAt,
		Evidence: map[string]any{"sessionsTombstonedAgain": len(plan.Found), "graceEndsAt": end.UTC().Format(time.RFC3339)}, Note: note}
	out.Warning = &Warning{Reason: lethev1.ReasonResurrected, Action: "Tombstone", Note: note}
	return out
}

// retombstoneMargin is how long after the recorded end the ledger rows of a
// re-tombstone end the grace period: more than the second the status loses
// (it keeps whole seconds), so that tombstonedAgain tells them apart from
// the first tombstone's rows.
const retombstoneMargin = 2 * time.Second

// recordedEnd is the grace period's end the request recorded at its
// tombstone, lost true when the database has no ledger row of the request
// left (a restore of a dump taken before it). The ledger's own end then no
// longer exists, and an empty ledger must not read as a grace period
// served.
func recordedEnd(er *lethev1.ErasureRequest, gs GraceState) (end time.Time, lost bool) {
	if !foundSessions(er) {
		return time.Time{}, false
	}
	if gs.LedgerRows > 0 {
		return er.Status.GraceEndsAt.Time, false
	}
	return er.Status.GraceEndsAt.Time, true
}

func foundSessions(er *lethev1.ErasureRequest) bool {
	return er.Status.GraceEndsAt != nil && er.Status.Plan != nil && er.Status.Plan.SessionsFound > 0
}

// tombstonedAgain reports whether the ledger rows are tombstoneAgain's: all
// of them end the grace period at least a second after the end the status
// recorded, where the first tombstone's (its first run's: a repeat may add
// a session found later) rounds down to it.
func tombstonedAgain(er *lethev1.ErasureRequest, gs GraceState) bool {
	return foundSessions(er) && gs.LedgerRows > 0 && !gs.EarliestEnd.Before(er.Status.GraceEndsAt.Add(time.Second))
}

// resurrectionRecorded reports whether the history holds a Resurrected entry
// from the re-tombstone at tombstonedAt (by the database's clock) or later.
func resurrectionRecorded(er *lethev1.ErasureRequest, tombstonedAt time.Time) bool {
	from := tombstonedAt.Truncate(time.Second)
	for _, h := range er.Status.History {
		if h.Event == lethev1.ReasonResurrected && !h.Time.Time.Before(from) {
			return true
		}
	}
	return false
}
