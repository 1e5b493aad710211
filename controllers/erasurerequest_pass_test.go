package controllers

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// A request whose store is gone waits for it: a request still at work
// looks again at the retry interval, a completed one (kept as evidence)
// at its re-verification interval.
func TestRequestWithoutItsStoreWaitsByWhereItIs(t *testing.T) {
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	r := &ErasureRequestReconciler{Client: fake.NewClientBuilder().WithScheme(s).Build(), RetryAfter: 15 * time.Second, ReverifyInterval: time.Hour}
	for phase, want := range map[lethev1.Phase]time.Duration{
		lethev1.PhaseDeleted:         15 * time.Second,
		lethev1.PhaseGraphReconciled: 15 * time.Second,
		lethev1.PhaseBackupsRotated:  time.Hour,
	} {
		er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r"},
			Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "gone"}},
			Status: lethev1.ErasureRequestStatus{Phase: phase, Conditions: []metav1.Condition{
				{Type: lethev1.ConditionTombstoned, Status: metav1.ConditionTrue, Reason: lethev1.ReasonSessionsTombstoned}}}}
		sc, out := r.scope(context.Background(), &pass{req: er})
		if sc != nil || out == nil || out.Kind != erasure.Waiting || out.RequeueAfter != want {
			t.Errorf("%s without its store: %+v, want waiting %s", phase, out, want)
		}
	}
}
