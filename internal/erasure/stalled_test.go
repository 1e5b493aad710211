package erasure

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// TestStalledOutcomes runs every way a step can stall (a Stalled outcome:
// Deletion's VerificationFailed and ResidueFound, GraphPrune's
// VerificationFailed) and checks that its reason is one of stalledReasons,
// so that the Stalled condition Summarize derives agrees: True, with the
// step's reason, while Ready and Reconciling are False. Every case of the
// step tables checks the first half too (checkInvariants).
func TestStalledOutcomes(t *testing.T) {
	cases := map[string]struct {
		reason string
		run    stepFn
		er     *lethev1.ErasureRequest
		store  *lethev1.MemoryStore
		fakes  fakes
	}{
		"Deletion/VerificationFailed": {reason: "Rows of the erased sessions remain after the deletion.",
			run: runDeletion, er: atDeletion(), fakes: deletionFakes(rowsLeft)},
		"Deletion/ResidueFound": {reason: "A copy of an erased embedding remains outside the cascade.",
			run: runDeletion, er: atDeletion(), fakes: deletionFakes(residueLeft)},
		"GraphPrune/VerificationFailed": {reason: "Graph elements remain after pruning twice.",
			run: runGraphPrune, er: atGraph(), store: newStore(withGraph), fakes: graphFakes(leftAfterPrune(oneFactLeft))},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out, er, _ := runCase(t, tc.run, stepCase{reason: tc.reason, er: tc.er, store: tc.store, fakes: tc.fakes})
			if out.Kind != Stalled || out.Condition == nil {
				t.Fatalf("%s\ngot kind %d with condition %+v, want Stalled with a condition", tc.reason, out.Kind, out.Condition)
			}
			if !stalledReasons[out.Condition.Reason] {
				t.Errorf("%s\nStalled with reason %q, which is not in stalledReasons: the Stalled condition would say False", tc.reason, out.Condition.Reason)
			}
			Summarize(er)
			want := map[string]metav1.Condition{
				lethev1.ConditionStalled: {Type: lethev1.ConditionStalled, Status: metav1.ConditionTrue, Reason: out.Condition.Reason,
					Message: out.Condition.Type + ": " + out.Condition.Message, ObservedGeneration: generation},
				lethev1.ConditionReady: {Type: lethev1.ConditionReady, Status: metav1.ConditionFalse, Reason: lethev1.ReasonInProgress,
					Message: "stalled at step " + out.Condition.Type + " (" + out.Condition.Reason + "): a human must act", ObservedGeneration: generation},
				lethev1.ConditionReconciling: {Type: lethev1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: out.Condition.Reason,
					Message: "stalled: a human must act (see the Stalled condition)", ObservedGeneration: generation},
			}
			for ct, w := range want {
				got := meta.FindStatusCondition(er.Status.Conditions, ct)
				if got == nil {
					t.Errorf("%s\nno %s condition after Summarize", tc.reason, ct)
					continue
				}
				if diff := cmp.Diff(w, *got, statusOpts); diff != "" {
					t.Errorf("%s\n%s: -want, +got:\n%s", tc.reason, ct, diff)
				}
			}
		})
	}
}
