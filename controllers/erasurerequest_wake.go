package controllers

import (
	"cmp"
	"context"
	"time"

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
// after it. written is the resourceVersion the parking pass left the
// request at ("" when its status write failed): the woken pass reads
// the request from the cache, and one that started before the cache held
// that write would be refused its own write (optimistic lock) and run
// again, so the wake also waits, at most cacheWait, for the cache to hold
// it. ctx is the controller's: it ends when the manager stops (the
// controller sets no ReconciliationTimeout), and a new manager's first
// list passes every request anyway.
func (r *ErasureRequestReconciler) wakeOn(ctx context.Context, done <-chan struct{}, er *lethev1.ErasureRequest, written string) {
	obj := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: er.Name, Namespace: er.Namespace}}
	go func() {
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
		r.awaitCached(ctx, client.ObjectKeyFromObject(obj), written)
		select {
		case r.wakes <- event.TypedGenericEvent[client.Object]{Object: obj}:
		case <-ctx.Done():
		}
	}()
}

// cachePoll is how often awaitCached looks at the cache.
const cachePoll = 20 * time.Millisecond

// awaitCached returns once the cached request is at resourceVersion
// written, or is gone, or r.cacheWait (DefaultWakeCacheWait when zero) has
// passed; at once when written is "". The bound keeps a request whose
// cached version moved past written (another writer) from waiting longer:
// its pass then meets the conflict and runs again, as without the wait.
func (r *ErasureRequestReconciler) awaitCached(ctx context.Context, key client.ObjectKey, written string) {
	if written == "" {
		return
	}
	deadline := time.Now().Add(cmp.Or(r.cacheWait, DefaultWakeCacheWait))
	for {
		// Read-only, so the cache's own copy serves (no deep copy per look).
		cached := &lethev1.ErasureRequest{}
		err := r.Client.Get(ctx, key, cached, client.UnsafeDisableDeepCopy)
		if err != nil || cached.ResourceVersion == written || !time.Now().Before(deadline) {
			return
		}
		select {
		case <-time.After(cachePoll):
		case <-ctx.Done():
			return
		}
	}
}

// DefaultWakeCacheWait bounds how long a wake waits for the cache to hold
// the parking pass's write.
const DefaultWakeCacheWait = 5 * time.Second
