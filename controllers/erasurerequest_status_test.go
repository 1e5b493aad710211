package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func cond(t, status, reason string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason}
}

func TestDerivePhase(t *testing.T) {
	T, F := "True", "False"
	cases := map[string]struct {
		conds  []metav1.Condition
		dryRun bool
		want   lethev1.Phase
	}{
		"nothing yet": {nil, false, lethev1.PhasePending},
		"tombstoned":  {[]metav1.Condition{cond(lethev1.ConditionTombstoned, T, "x"), cond(lethev1.ConditionGracePeriodElapsed, F, lethev1.ReasonWaitingForGrace)}, false, lethev1.PhaseTombstoned},
		"grace over":  {[]metav1.Condition{cond(lethev1.ConditionTombstoned, T, "x"), cond(lethev1.ConditionGracePeriodElapsed, T, "x"), cond(lethev1.ConditionDeleted, F, lethev1.ReasonDeleting)}, false, lethev1.PhaseGracePeriod},
		"cancelled":   {[]metav1.Condition{cond(lethev1.ConditionTombstoned, T, "x"), cond(lethev1.ConditionGracePeriodElapsed, F, lethev1.ReasonCancelled)}, false, lethev1.PhaseCancelled},
		"planned":     {[]metav1.Condition{cond(lethev1.ConditionTombstoned, F, lethev1.ReasonDryRun)}, true, lethev1.PhasePlanned},
		"gap stops":   {[]metav1.Condition{cond(lethev1.ConditionTombstoned, T, "x"), cond(lethev1.ConditionDeleted, T, "x")}, false, lethev1.PhaseTombstoned},
		"all done": {[]metav1.Condition{cond(lethev1.ConditionTombstoned, T, "x"), cond(lethev1.ConditionGracePeriodElapsed, T, "x"), cond(lethev1.ConditionDeleted, T, "x"),
			cond(lethev1.ConditionGraphReconciled, T, "x"), cond(lethev1.ConditionBackupsRotated, T, "x")}, false, lethev1.PhaseBackupsRotated},
	}
	for name, tc := range cases {
		if got := derivePhase(tc.conds, tc.dryRun); got != tc.want {
			t.Errorf("%s: phase %s, want %s", name, got, tc.want)
		}
	}
}

func TestTerminalAndSummary(t *testing.T) {
	cancelled := []metav1.Condition{cond(lethev1.ConditionGracePeriodElapsed, "False", lethev1.ReasonCancelled)}
	if !terminal(cancelled) || !terminal([]metav1.Condition{cond(lethev1.ConditionTombstoned, "False", lethev1.ReasonDryRun)}) {
		t.Error("cancelled and planned requests must be terminal")
	}
	if terminal([]metav1.Condition{cond(lethev1.ConditionTombstoned, "True", "x")}) {
		t.Error("a tombstoned request is not terminal")
	}
	residue := []metav1.Condition{cond(lethev1.ConditionTombstoned, "True", "x"), cond(lethev1.ConditionGracePeriodElapsed, "True", "x"),
		cond(lethev1.ConditionDeleted, "False", lethev1.ReasonResidueFound)}
	ready, stalled := summary(residue, derivePhase(residue, false), 3)
	if ready.Status != metav1.ConditionFalse || stalled.Status != metav1.ConditionTrue || stalled.Reason != lethev1.ReasonResidueFound || stalled.ObservedGeneration != 3 {
		t.Errorf("residue: ready %+v, stalled %+v", ready, stalled)
	}
	waiting := []metav1.Condition{cond(lethev1.ConditionTombstoned, "True", "x"), cond(lethev1.ConditionGracePeriodElapsed, "False", lethev1.ReasonWaitingForGrace)}
	if _, stalled := summary(waiting, derivePhase(waiting, false), 1); stalled.Status != metav1.ConditionFalse {
		t.Errorf("waiting for the grace period is not stalled: %+v", stalled)
	}
}
