package controllers

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// createEvent passes a Create event through the controller's two watches
// of requests as SetupWithManager wires them: its own (the predicates,
// then controller-runtime's handler) and doneAtStartHandler.
func createEvent(q priorityqueue.PriorityQueue[reconcile.Request], er *lethev1.ErasureRequest, initial bool) {
	ctx := context.Background()
	e := event.CreateEvent{Object: er, IsInInitialList: initial}
	pass := true
	for _, p := range requestPredicates() {
		pass = pass && p.Create(e)
	}
	if pass {
		(&handler.EnqueueRequestForObject{}).Create(ctx, e, q)
	}
	doneAtStartHandler().Create(ctx, e, q)
}

func requestAt(name string, phase lethev1.Phase, deleting bool) *lethev1.ErasureRequest {
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	er.Status.Phase = phase
	if deleting {
		now := metav1.Now()
		er.DeletionTimestamp = &now
		er.Finalizers = []string{"erasure.lethe.dev/finalizer"}
	}
	return er
}

// After a start, the first list's requests still under way leave the
// queue before the done ones, in the list's order; a done request being
// deleted keeps its place (its finalizer waits for its pass), and each
// request is queued once.
func TestAStartPassesRequestsUnderWayBeforeDoneOnes(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("start-order-test")
	defer q.ShutDown()
	list := []*lethev1.ErasureRequest{
		requestAt("done-1", lethev1.PhaseBackupsRotated, false),
		requestAt("tombstoned", lethev1.PhaseTombstoned, false),
		requestAt("cancelled", lethev1.PhaseCancelled, false),
		requestAt("done-deleting", lethev1.PhaseBackupsRotated, true),
		requestAt("new", "", false),
		requestAt("graph", lethev1.PhaseGraphReconciled, false),
		requestAt("planned", lethev1.PhasePlanned, false),
	}
	for _, er := range list {
		createEvent(q, er, true)
	}
	want := []string{"tombstoned", "done-deleting", "new", "graph", "done-1", "cancelled", "planned"}
	if n := q.Len(); n != len(want) {
		t.Fatalf("%d requests queued, want %d (each once)", n, len(want))
	}
	for i, name := range want {
		got, _, _ := q.GetWithPriority()
		if got.Name != name {
			t.Fatalf("request %d out of the queue is %s, want %s (order %v)", i, got.Name, name, want)
		}
		q.Done(got)
	}
}

// A done request created or seen outside a start's first list (a watch
// resumed, a request applied already done by a restore of the API
// server's objects) is queued as any other, and only once.
func TestOnlyTheFirstListsDoneRequestsWait(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("start-order-live-test")
	defer q.ShutDown()
	createEvent(q, requestAt("new", "", false), false)
	createEvent(q, requestAt("done", lethev1.PhaseBackupsRotated, false), false)
	if n := q.Len(); n != 2 {
		t.Fatalf("%d requests queued, want 2", n)
	}
	for _, name := range []string{"new", "done"} {
		got, prio, _ := q.GetWithPriority()
		if got.Name != name || prio != 0 {
			t.Fatalf("got %s at priority %d, want %s at 0", got.Name, prio, name)
		}
		q.Done(got)
	}
}
