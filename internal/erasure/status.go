package erasure

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// stepConditions are the step conditions in pipeline order.
var stepConditions = []string{
	lethev1.ConditionTombstoned,
	lethev1.ConditionGracePeriodElapsed,
	lethev1.ConditionDeleted,
	lethev1.ConditionGraphReconciled,
	lethev1.ConditionBackupsRotated,
}

// milestoneOf maps a step condition to the phase reached when it is True.
var milestoneOf = map[string]lethev1.Phase{
	lethev1.ConditionTombstoned:         lethev1.PhaseTombstoned,
	lethev1.ConditionGracePeriodElapsed: lethev1.PhaseGracePeriod,
	lethev1.ConditionDeleted:            lethev1.PhaseDeleted,
	lethev1.ConditionGraphReconciled:    lethev1.PhaseGraphReconciled,
	lethev1.ConditionBackupsRotated:     lethev1.PhaseBackupsRotated,
}

// derivePhase computes the phase from the conditions alone: the last step
// milestone reached in order, or a terminal outcome. It never reads the phase.
func derivePhase(conds []metav1.Condition, dryRun bool) lethev1.Phase {
	grace := meta.FindStatusCondition(conds, lethev1.ConditionGracePeriodElapsed)
	if grace != nil && grace.Reason == lethev1.ReasonCancelled {
		return lethev1.PhaseCancelled
	}
	if tomb := meta.FindStatusCondition(conds, lethev1.ConditionTombstoned); dryRun && tomb != nil && tomb.Reason == lethev1.ReasonDryRun {
		return lethev1.PhasePlanned
	}
	phase := lethev1.PhasePending
	for _, t := range stepConditions {
		if !meta.IsStatusConditionTrue(conds, t) {
			break
		}
		phase = milestoneOf[t]
	}
	return phase
}

// terminal reports a request that ended without completing: planned (dry
// run) or cancelled. Nothing more happens to it.
func terminal(conds []metav1.Condition) bool {
	if c := meta.FindStatusCondition(conds, lethev1.ConditionTombstoned); c != nil && c.Reason == lethev1.ReasonDryRun {
		return true
	}
	c := meta.FindStatusCondition(conds, lethev1.ConditionGracePeriodElapsed)
	return c != nil && c.Reason == lethev1.ReasonCancelled
}

// stalledReasons are the step reasons that need a human: a Stalled outcome
// uses one of them, and the Stalled condition is True while the pending
// step has one.
var stalledReasons = map[string]bool{
	lethev1.ReasonResidueFound:         true,
	lethev1.ReasonVerificationFailed:   true,
	lethev1.ReasonStoreNotFound:        true,
	lethev1.ReasonGracePeriodTooShort:  true,
	lethev1.ReasonBackupDeletionFailed: true,
	lethev1.ReasonCancelledInDatabase:  true,
}

// summary computes Ready and Stalled from the step conditions.
func summary(conds []metav1.Condition, phase lethev1.Phase, generation int64) (ready, stalled metav1.Condition) {
	ready = metav1.Condition{Type: lethev1.ConditionReady, ObservedGeneration: generation}
	stalled = metav1.Condition{Type: lethev1.ConditionStalled, ObservedGeneration: generation,
		Status: metav1.ConditionFalse, Reason: lethev1.ReasonNoActionNeeded, Message: "no human action is needed"}
	pending := pendingStep(conds)
	if pending != nil {
		if stalledReasons[pending.Reason] {
			stalled.Status, stalled.Reason, stalled.Message = metav1.ConditionTrue, pending.Reason, pending.Type+": "+pending.Message
		}
	}
	switch phase {
	case lethev1.PhaseBackupsRotated:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, lethev1.ReasonCompleted, "every step of the erasure is done"
	case lethev1.PhasePlanned:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, lethev1.ReasonDryRun, "dry run: the plan is in status.plan; nothing was changed"
	case lethev1.PhaseCancelled:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, lethev1.ReasonCancelled, "cancelled before deletion: the tombstones were lifted"
	default:
		// Short, for the Status column of kubectl get: the step and why it
		// has not finished; the step condition's message has the details.
		ready.Status, ready.Reason = metav1.ConditionFalse, lethev1.ReasonInProgress
		ready.Message = "waiting for step " + firstPending(conds)
		if b := blockingStep(conds); b != nil && b.Reason != "" {
			ready.Message += " (" + b.Reason + ")"
		}
		if stalled.Status == metav1.ConditionTrue {
			ready.Message = "stalled at step " + pending.Type + " (" + pending.Reason + "): a human must act"
		}
	}
	return ready, stalled
}

// reconciling derives the Reconciling condition kstatus reads (Flux's
// health checks): True while the request still moves by itself, with the
// reason of the step it is on; False once it is done, planned, cancelled
// or stalled on a human. It reads only the conditions given.
func reconciling(conds []metav1.Condition, ready, stalled metav1.Condition, phase lethev1.Phase, generation int64) metav1.Condition {
	c := metav1.Condition{Type: lethev1.ConditionReconciling, ObservedGeneration: generation, Status: metav1.ConditionFalse}
	switch {
	case stalled.Status == metav1.ConditionTrue:
		c.Reason, c.Message = stalled.Reason, "stalled: a human must act (see the Stalled condition)"
	case ready.Status == metav1.ConditionTrue:
		c.Reason, c.Message = ready.Reason, "nothing more to do: "+ready.Message
	default:
		c.Status = metav1.ConditionTrue
		c.Reason, c.Message = lethev1.ReasonProgressing, "working on step "+firstPending(conds)
		if b := blockingStep(conds); b != nil && b.Reason != "" {
			c.Reason, c.Message = b.Reason, b.Type+": "+b.Message
		}
	}
	return c
}

// pendingStep is the first step condition, in pipeline order, that is
// present and not True (steps not yet reported are skipped); nil when none.
func pendingStep(conds []metav1.Condition) *metav1.Condition {
	for _, t := range stepConditions {
		if c := meta.FindStatusCondition(conds, t); c != nil && c.Status != metav1.ConditionTrue {
			return c
		}
	}
	return nil
}

// blockingStep is the step the request is on (firstPending) when it has
// reported a condition; nil when it has not yet.
func blockingStep(conds []metav1.Condition) *metav1.Condition {
	if p := pendingStep(conds); p != nil && p.Type == firstPending(conds) {
		return p
	}
	return nil
}

func firstPending(conds []metav1.Condition) string {
	for _, t := range stepConditions {
		if !meta.IsStatusConditionTrue(conds, t) {
			return t
		}
	}
	return "none"
}

// PlanStatus converts the database plan into the API's shape: the
// Tombstoned history entry and receipt digest it.
func PlanStatus(p Plan) *lethev1.ErasurePlan {
	out := &lethev1.ErasurePlan{
		SessionsFound:       int32(len(p.Found)),
		Embeddings:          p.Embeddings,
		ContentIndexEntries: p.ContentIndexEntries,
		DerivedRecords:      p.DerivedRecords,
		PlannedAt:           &metav1.Time{Time: p.TombstonedAt.UTC().Truncate(time.Second)},
	}
	for _, id := range p.NotFound {
		out.NotFoundSessionIDs = append(out.NotFoundSessionIDs, lethev1.SessionID(id))
	}
	for _, c := range p.Rows {
		out.Rows = append(out.Rows, lethev1.TableCount{Table: c.Table, Rows: c.Rows})
	}
	return out
}

// deadline is one calendar month after the request (GDPR Art. 12(3)).
func deadline(requested time.Time) time.Time { return requested.AddDate(0, 1, 0) }

// Summarize derives the phase, Ready, Stalled and Reconciling from the
// step conditions alone, and stamps the observed generation.
func Summarize(er *lethev1.ErasureRequest) {
	st := &er.Status
	st.Phase = derivePhase(st.Conditions, er.Spec.DryRun)
	ready, stalled := summary(st.Conditions, st.Phase, er.Generation)
	if st.Phase == lethev1.PhaseBackupsRotated && st.Receipt != nil && st.Receipt.Envelope == "" {
		ready.Message += "; the receipt is unsigned: no signing key is configured (--receipt-key-secret)"
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	meta.SetStatusCondition(&st.Conditions, stalled)
	meta.SetStatusCondition(&st.Conditions, reconciling(st.Conditions, ready, stalled, st.Phase, er.Generation))
	st.ObservedGeneration = er.Generation
}

// Terminal reports a request that ended without completing: planned (dry run)
// or cancelled. Nothing more happens to it, not even a status rewrite.
func Terminal(er *lethev1.ErasureRequest) bool { return terminal(er.Status.Conditions) }

// FirstPending is the first step condition, in order, that is not True
// ("none" when every step is done).
func FirstPending(er *lethev1.ErasureRequest) string { return firstPending(er.Status.Conditions) }

// DeletionClaimed reports whether the request's deletion was claimed: its
// Deleted condition is True or carries a reason only a claim leads to. A
// Deleted condition written before the claim (the store not ready, the
// database unreachable) is not one.
func DeletionClaimed(er *lethev1.ErasureRequest) bool {
	c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionDeleted)
	return c != nil && (c.Status == metav1.ConditionTrue || claimedReasons[c.Reason])
}

// Deadline is one calendar month after the request (GDPR Art. 12(3)).
func Deadline(requested time.Time) time.Time { return deadline(requested) }

// UnbackedConditions lists the step conditions that are True without the
// milestone entry that always comes with them in the history: set by
// someone else than the manager, they would make it skip a step.
func UnbackedConditions(er *lethev1.ErasureRequest) []string {
	reached := map[lethev1.Phase]bool{}
	for _, e := range er.Status.History {
		if e.Event != lethev1.ReasonResurrected {
			reached[e.Phase] = true
		}
	}
	var out []string
	for _, t := range stepConditions {
		if meta.IsStatusConditionTrue(er.Status.Conditions, t) && !reached[milestoneOf[t]] {
			out = append(out, t)
		}
	}
	return out
}
