package erasure

import (
	"strings"
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

// TestDeriveReconciling walks a request through every phase and checks the
// condition kstatus reads: True (with the step's reason) while the request
// moves by itself, False once it is done, stopped or waiting on a human.
func TestDeriveReconciling(t *testing.T) {
	T, F := "True", "False"
	stepMsg := func(c metav1.Condition, msg string) metav1.Condition { c.Message = msg; return c }
	done := func(types ...string) []metav1.Condition {
		var out []metav1.Condition
		for _, ty := range types {
			out = append(out, cond(ty, T, "x"))
		}
		return out
	}
	cases := map[string]struct {
		conds      []metav1.Condition
		dryRun     bool
		status     metav1.ConditionStatus
		reason     string
		msgHas     string
		readyMsgIs string
	}{
		"picked up, nothing reported": {nil, false, metav1.ConditionTrue, lethev1.ReasonProgressing, "Tombstoned", "waiting for step Tombstoned"},
		"grace period": {append(done(lethev1.ConditionTombstoned),
			stepMsg(cond(lethev1.ConditionGracePeriodElapsed, F, lethev1.ReasonWaitingForGrace), "until 2030-01-08T00:00:00Z")),
			false, metav1.ConditionTrue, lethev1.ReasonWaitingForGrace, "GracePeriodElapsed: until 2030-01-08",
			"waiting for step GracePeriodElapsed (WaitingForGracePeriod)"},
		"deleting in batches": {append(done(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed),
			cond(lethev1.ConditionDeleted, F, lethev1.ReasonDeleting)), false, metav1.ConditionTrue, lethev1.ReasonDeleting, "Deleted",
			"waiting for step Deleted (Deleting)"},
		"replica lagging": {append(done(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed),
			cond(lethev1.ConditionDeleted, F, lethev1.ReasonReplicaLagging)), false, metav1.ConditionTrue, lethev1.ReasonReplicaLagging, "Deleted",
			"waiting for step Deleted (ReplicaLagging)"},
		"database unreachable retries": {append(done(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted),
			cond(lethev1.ConditionGraphReconciled, F, lethev1.ReasonDatabaseUnavailable)), false, metav1.ConditionTrue, lethev1.ReasonDatabaseUnavailable, "GraphReconciled",
			"waiting for step GraphReconciled (DatabaseUnavailable)"},
		"backups expiring": {append(done(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted, lethev1.ConditionGraphReconciled),
			stepMsg(cond(lethev1.ConditionBackupsRotated, F, lethev1.ReasonBackupsExpiring), "2 Velero Backup(s) remain")),
			false, metav1.ConditionTrue, lethev1.ReasonBackupsExpiring, "BackupsRotated: 2 Velero Backup(s) remain",
			"waiting for step BackupsRotated (BackupsExpiring)"},
		"next step not reported yet": {done(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed),
			false, metav1.ConditionTrue, lethev1.ReasonProgressing, "Deleted", "waiting for step Deleted"},
		"completed": {done(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted, lethev1.ConditionGraphReconciled, lethev1.ConditionBackupsRotated),
			false, metav1.ConditionFalse, lethev1.ReasonCompleted, "", "every step of the erasure is done"},
		"planned": {[]metav1.Condition{cond(lethev1.ConditionTombstoned, F, lethev1.ReasonDryRun)}, true, metav1.ConditionFalse, lethev1.ReasonDryRun, "", ""},
		"cancelled": {append(done(lethev1.ConditionTombstoned), cond(lethev1.ConditionGracePeriodElapsed, F, lethev1.ReasonCancelled)),
			false, metav1.ConditionFalse, lethev1.ReasonCancelled, "", ""},
		"stalled on residue": {append(done(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed),
			cond(lethev1.ConditionDeleted, F, lethev1.ReasonResidueFound)), false, metav1.ConditionFalse, lethev1.ReasonResidueFound, "human",
			"stalled at step Deleted (ResidueFound): a human must act"},
		"stalled: store missing": {[]metav1.Condition{cond(lethev1.ConditionTombstoned, F, lethev1.ReasonStoreNotFound)},
			false, metav1.ConditionFalse, lethev1.ReasonStoreNotFound, "human", "stalled at step Tombstoned (StoreNotFound): a human must act"},
	}
	for name, tc := range cases {
		phase := derivePhase(tc.conds, tc.dryRun)
		ready, stalled := summary(tc.conds, phase, 4)
		got := reconciling(tc.conds, ready, stalled, phase, 4)
		if got.Type != lethev1.ConditionReconciling || got.Status != tc.status || got.Reason != tc.reason || got.ObservedGeneration != 4 {
			t.Errorf("%s (phase %s): Reconciling %s/%s gen %d, want %s/%s", name, phase, got.Status, got.Reason, got.ObservedGeneration, tc.status, tc.reason)
		}
		if !strings.Contains(got.Message, tc.msgHas) || got.Message == "" {
			t.Errorf("%s: Reconciling message %q, want it to name %q", name, got.Message, tc.msgHas)
		}
		// kstatus: Reconciling and Stalled are never both True.
		if got.Status == metav1.ConditionTrue && stalled.Status == metav1.ConditionTrue {
			t.Errorf("%s: Reconciling and Stalled both True", name)
		}
		// Reconciling True means not Ready, and the other way round for a request that moves.
		if got.Status == metav1.ConditionTrue && ready.Status == metav1.ConditionTrue {
			t.Errorf("%s: Reconciling while Ready", name)
		}
		if tc.readyMsgIs != "" && ready.Message != tc.readyMsgIs {
			t.Errorf("%s: Ready message %q, want %q", name, ready.Message, tc.readyMsgIs)
		}
	}
}
