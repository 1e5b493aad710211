package erasure

import (
	"context"
	"errors"
	"fmt"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Tombstoning is step 1: one transaction tombstones the tenant's sessions,
// writes the ledger and the receipt, and takes the plan. A dry run only
// plans; a request cancelled before this step ends at once.
type Tombstoning struct {
	Config Config
	// Waits remembers the position the replicas must replay (nil: none).
	Waits *ReplicaWaits
}

// Name is the step's condition type.
func (Tombstoning) Name() string { return lethev1.ConditionTombstoned }

func (t Tombstoning) Run(ctx context.Context, s *Scope) Outcome {
	er := s.Request
	if s.isTrue(lethev1.ConditionTombstoned) {
		return Outcome{Kind: Done}
	}
	req := LedgerRequest(er)
	if er.Spec.DryRun {
		return t.plan(ctx, s, req)
	}
	if er.Spec.Cancel {
		// A tombstone may have committed in a pass whose status write was
		// lost: the cancel lifts it (a no-op with a receipt when there is none).
		if out, ok := cancel(ctx, s, t.Config); ok {
			return out
		}
		return Outcome{Kind: Ended,
			Condition: condition(lethev1.ConditionGracePeriodElapsed, false, lethev1.ReasonCancelled, "cancelled before the sessions were tombstoned"),
			Milestone: &Milestone{Phase: lethev1.PhaseCancelled, At: s.Clock.Now(), Evidence: map[string]int{"tombstonesLifted": 0},
				Note: "cancelled before tombstoning"},
		}
	}
	if out, ok := t.graceAllowed(er, req); !ok {
		return out
	}
	plan, err := s.Ledger.Tombstone(ctx, req)
	if errors.Is(err, ErrCancelled) {
		return cancelledInTheDatabase(t.Config, lethev1.ConditionTombstoned)
	}
	if err != nil {
		return failed(t.Config, lethev1.ConditionTombstoned, lethev1.ReasonDatabaseUnavailable,
			"the tombstone transaction failed; Lethe retries", err)
	}
	if out, ok := t.replicasHide(ctx, s, plan); !ok {
		return out
	}
	ps := PlanStatus(plan)
	note := fmt.Sprintf("%d of %d sessions found and tombstoned", len(plan.Found), len(req.SessionIDs))
	out := done(lethev1.ConditionTombstoned, lethev1.ReasonSessionsTombstoned,
		"the requested sessions of this tenant are tombstoned and hidden from every read path")
	if len(plan.Found) == 0 {
		out = done(lethev1.ConditionTombstoned, lethev1.ReasonNoSessionsFound,
			"none of the requested sessions exists for this store's tenant; nothing was touched")
	}
	t.flagDeadline(s, plan, &out, &note)
	out.Plan, out.GraceEndsAt = ps, &plan.GraceEndsAt
	out.Evidence = &lethev1.StepEvidence{Step: lethev1.ConditionTombstoned, StartedAt: mtime(plan.TombstonedAt),
		CompletedAt: mtime(plan.TombstonedAt), Counts: ps.Rows, Note: note}
	out.Milestone = &Milestone{Phase: lethev1.PhaseTombstoned, At: plan.TombstonedAt, Evidence: ps, Note: note}
	return out
}

// cancelledInTheDatabase is the outcome of a tombstone the database
// refused (ErrCancelled) for a request whose spec does not cancel it: a
// Cancelled receipt says its tombstones were lifted as if it were gone. A
// pass that read the request before its cancel ends here too; its status
// write then conflicts and the next pass reads the cancel.
func cancelledInTheDatabase(cfg Config, cond string) Outcome {
	return stalled(cfg.ReverifyInterval, cond, lethev1.ReasonCancelledInDatabase,
		"the database holds a Cancelled receipt for this request (its tombstones were lifted as if it were gone): "+
			"its sessions are not tombstoned again; apply the request again under a new name")
}

// graceAllowed refuses, before anything is touched, a grace period below
// the manager's minimum on a request that is not immediate: the grace
// period is the undo for typos. The spec cannot change: the request stays
// stalled until it is deleted and created again.
func (t Tombstoning) graceAllowed(er *lethev1.ErasureRequest, req Request) (Outcome, bool) {
	if er.Spec.Immediate || req.Grace >= t.Config.MinGracePeriod {
		return Outcome{}, true
	}
	return stalled(t.Config.ReverifyInterval, lethev1.ConditionTombstoned, lethev1.ReasonGracePeriodTooShort,
		fmt.Sprintf("spec.gracePeriod %s is below the minimum of %s (the manager's --min-grace-period): the grace period is the undo for typos; "+
			"create the request again with a longer one, or with immediate: true and a reason", req.Grace, t.Config.MinGracePeriod)), false
}

// flagDeadline says, on the Tombstoned condition and in a Warning, when the
// grace period and the store's rotation window end after the request's
// deadline: the erased data would outlive it in the backups.
func (t Tombstoning) flagDeadline(s *Scope, plan Plan, out *Outcome, note *string) {
	if s.Request.Status.Deadline == nil || len(plan.Found) == 0 {
		return
	}
	var window time.Duration
	if s.Store.Spec.Velero != nil {
		window = s.Store.Spec.Velero.RotationWindowOrDefault()
	}
	end := plan.GraceEndsAt.Add(window)
	if !end.After(s.Request.Status.Deadline.Time) {
		return
	}
	out.Condition.Message += "; the grace period and the store's rotation window end after status.deadline: the data would outlive it in backups"
	*note += fmt.Sprintf("; grace end plus rotation window (%s) is after the deadline", window)
	out.Warning = &Warning{Reason: lethev1.ReasonDeadlineAtRisk, Action: "Plan",
		Note: fmt.Sprintf("grace end plus the store's rotation window (%s) is %s after the deadline", window, end.Sub(s.Request.Status.Deadline.Time).Round(time.Minute))}
}

// replicasHide waits until every replica has replayed the tombstone: until
// then a read replica still serves the sessions the request hides. The
// tombstone is repeated on the next pass (it reports the first one's
// readings), so nothing is recorded before the replicas caught up; the
// position waited for is the first one's (ReplicaWaits).
func (t Tombstoning) replicasHide(ctx context.Context, s *Scope, plan Plan) (Outcome, bool) {
	if len(plan.Found) == 0 {
		return Outcome{}, true
	}
	caughtUp, err := t.Waits.caughtUp(ctx, s, lethev1.ConditionTombstoned, plan.CommitLSN, tombstoneOf(plan))
	switch {
	case err != nil:
		return failed(t.Config, lethev1.ConditionTombstoned, lethev1.ReasonReplicaLagging,
			"tombstoned on the primary; a replica could not be asked whether it replayed the tombstone and is retried", err), false
	case !caughtUp:
		return waiting(t.Config.ReplicaRecheck, lethev1.ConditionTombstoned, lethev1.ReasonReplicaLagging,
			"tombstoned on the primary; waiting for every replica to replay the tombstone (until then a replica serves the sessions)"), false
	}
	return Outcome{}, true
}

// plan takes the dry run's plan: what the deletion, the graph step and the
// backup step would touch, changing nothing.
func (t Tombstoning) plan(ctx context.Context, s *Scope, req Request) Outcome {
	plan, err := s.Ledger.Plan(ctx, req)
	if err != nil {
		return failed(t.Config, lethev1.ConditionTombstoned, lethev1.ReasonDatabaseUnavailable,
			"the plan could not be taken; Lethe retries", err)
	}
	ps := PlanStatus(plan)
	if s.Graph != nil && len(plan.Found) > 0 {
		gctx, cancel := context.WithTimeout(ctx, t.Config.GraphTimeout)
		c, err := s.Graph.Count(gctx, plan.Found)
		cancel()
		if err != nil {
			return failed(t.Config, lethev1.ConditionTombstoned, lethev1.ReasonGraphUnavailable,
				"the graph could not be counted for the plan; Lethe retries", err)
		}
		ps.GraphNodes, ps.GraphRelationships = c.NodeTotal(), c.RelationshipTotal()
	}
	if s.Backups != nil {
		n, f := holdingBackups(ctx, s, plan)
		if f != nil {
			return *f
		}
		ps.Backups = int32(n)
	}
	return Outcome{Kind: Ended, Plan: ps,
		Condition: condition(lethev1.ConditionTombstoned, false, lethev1.ReasonDryRun, "dry run: the plan is in status.plan and nothing was tombstoned"),
		Milestone: &Milestone{Phase: lethev1.PhasePlanned, Event: lethev1.ReasonDryRun, At: plan.TombstonedAt, Evidence: ps,
			Note: fmt.Sprintf("dry run planned: %d of %d sessions found", len(plan.Found), len(req.SessionIDs))},
	}
}

// holdingBackups counts the Backups that would hold the sessions were they
// deleted now; zero while Velero is not installed or the selector is invalid
// (the backup step reports those).
func holdingBackups(ctx context.Context, s *Scope, plan Plan) (int, *Outcome) {
	installed, err := s.Backups.Installed(ctx)
	if err != nil {
		out := errored(err)
		return 0, &out
	}
	sc, err := backupScope(s.Store)
	if !installed || err != nil {
		return 0, nil
	}
	n, err := s.Backups.Holding(ctx, sc, BackupRequest{UID: s.uid(), DeletedAt: plan.TombstonedAt})
	if err != nil {
		out := errored(err)
		return 0, &out
	}
	return n, nil
}
