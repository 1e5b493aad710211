package controllers

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// WakePriority is the queue priority of a woken request, above the default
// (0) of a request just created or edited: a request whose outside work
// ended finishes before new requests start. Else, with thousands applied
// at once, each would park after its deletion until every other one had
// had its first pass, and the manager would hold all of them, untrimmed,
// with their parked evidence, at the same time.
const WakePriority = 10

// wakeHandler enqueues a woken request at WakePriority (plainly where the
// controller's queue has no priorities).
func wakeHandler() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.Object)}
			if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
				pq.AddWithOpts(priorityqueue.AddOpts{Priority: new(WakePriority)}, req)
				return
			}
			q.Add(req)
		},
	}
}

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
