package erasure

import (
	"context"
	"fmt"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Tombstoning is step 1: one transaction tombstones the tenant's sessions,
// writes the ledger and the receipt, and takes the plan. A dry run only
// plans; a request cancelled before this step ends at once.
type Tombstoning struct{ Config Config }

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
		return Outcome{Kind: Ended,
			Condition: condition(lethev1.ConditionGracePeriodElapsed, false, lethev1.ReasonCancelled, "cancelled before the sessions were tombstoned"),
			Milestone: &Milestone{Phase: lethev1.PhaseCancelled, At: s.Clock.Now(), Evidence: map[string]int{"tombstonesLifted": 0},
				Note: "cancelled before tombstoning"},
		}
	}
	plan, err := s.Ledger.Tombstone(ctx, req)
	if err != nil {
		return failed(t.Config, lethev1.ConditionTombstoned, lethev1.ReasonDatabaseUnavailable,
			"the tombstone transaction failed; Lethe retries", err)
	}
	ps := PlanStatus(plan)
	note := fmt.Sprintf("%d of %d sessions found and tombstoned", len(plan.Found), len(req.SessionIDs))
	out := done(lethev1.ConditionTombstoned, lethev1.ReasonSessionsTombstoned,
		"the requested sessions of this tenant are tombstoned and hidden from every read path")
	if len(plan.Found) == 0 {
		out = done(lethev1.ConditionTombstoned, lethev1.ReasonNoSessionsFound,
			"none of the requested sessions exists for this store's tenant; nothing was touched")
	}
	out.Plan, out.GraceEndsAt = ps, &plan.GraceEndsAt
	out.Evidence = &lethev1.StepEvidence{Step: lethev1.ConditionTombstoned, StartedAt: mtime(plan.TombstonedAt),
		CompletedAt: mtime(plan.TombstonedAt), Counts: ps.Rows, Note: note}
	out.Milestone = &Milestone{Phase: lethev1.PhaseTombstoned, At: plan.TombstonedAt, Evidence: ps, Note: note}
	return out
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
