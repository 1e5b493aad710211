package controllers

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// DoneAtStartPriority is the queue priority, when the manager starts, of a
// request already done (a final phase: BackupsRotated, Cancelled, or Planned
// for a dry run, whose pass only reaps it once expired): below the other
// requests of the first list (handler.LowPriority). Every request gets a
// pass after a start, and a done one's pass only re-verifies; in the
// order of the list, requests still under way waited behind every done
// request before them, after each restart.
const DoneAtStartPriority = handler.LowPriority - 100

// doneAtStart reports whether o, seen in the first list of a start
// (initial), is a request already done and not being deleted (its
// finalizer waits for a pass, at the list's usual priority).
func doneAtStart(o client.Object, initial bool) bool {
	er, ok := o.(*lethev1.ErasureRequest)
	if !ok || !initial || !er.DeletionTimestamp.IsZero() {
		return false
	}
	return er.Status.Phase.Final()
}

// notDoneAtStart keeps the first list's done requests from the controller's
// own watch of requests: doneAtStartHandler enqueues them.
func notDoneAtStart() predicate.Predicate {
	return predicate.Funcs{CreateFunc: func(e event.CreateEvent) bool { return !doneAtStart(e.Object, e.IsInInitialList) }}
}

// doneAtStartHandler enqueues the first list's done requests at
// DoneAtStartPriority, and nothing else. Without controller-runtime's
// priority queue (on by default) they are added plainly, in whatever
// order the two watches' events come.
func doneAtStartHandler() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if !doneAtStart(e.Object, e.IsInInitialList) {
				return
			}
			req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.Object)}
			if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
				pq.AddWithOpts(priorityqueue.AddOpts{Priority: new(DoneAtStartPriority)}, req)
				return
			}
			q.Add(req)
		},
	}
}
