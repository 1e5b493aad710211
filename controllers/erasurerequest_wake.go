package controllers

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// wakeOn brings the request to a pass once done is closed: a step that
// waits on work running outside the pass (erasure.Outcome.Wake, e.g. the
// vacuum after a deletion) is woken, not polled, so its wait adds no pass
// and no API call, and leaves no requeue behind to run a needless pass
// after it. ctx is the controller's: it ends when the manager stops (the
// controller sets no ReconciliationTimeout), and a new manager's first
// list passes every request anyway.
func (r *ErasureRequestReconciler) wakeOn(ctx context.Context, done <-chan struct{}, er *lethev1.ErasureRequest) {
	obj := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: er.Name, Namespace: er.Namespace}}
	go func() {
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
		select {
		case r.wakes <- event.TypedGenericEvent[client.Object]{Object: obj}:
		case <-ctx.Done():
		}
	}()
}
