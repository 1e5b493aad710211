package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func wakeEvent(name string) event.TypedGenericEvent[client.Object] {
	return event.TypedGenericEvent[client.Object]{Object: &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}}
}

func queued(name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}}
}

// A woken request leaves controller-runtime's priority queue before the
// backlog of requests created before it, and before its own pending
// recheck; the backlog then leaves in its order.
func TestWokenRequestGoesAheadOfTheBacklog(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("wake-test")
	defer q.ShutDown()
	for _, n := range []string{"new-1", "new-2", "new-3"} {
		q.Add(queued(n))
	}
	// The parked request also waits for a recheck an hour from now.
	q.AddWithOpts(priorityqueue.AddOpts{After: time.Hour}, queued("parked"))
	wakeHandler().Generic(context.Background(), wakeEvent("parked"), q)

	want := []struct {
		name     string
		priority int
	}{{"parked", WakePriority}, {"new-1", 0}, {"new-2", 0}, {"new-3", 0}}
	for _, w := range want {
		item, priority, shutdown := q.GetWithPriority()
		if shutdown {
			t.Fatal("the queue shut down")
		}
		if item != queued(w.name) || priority != w.priority {
			t.Fatalf("got %s at priority %d, want %s at %d", item.Name, priority, w.name, w.priority)
		}
		q.Done(item)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("%d items left in the queue, want none (the woken request's recheck merged into its wake)", n)
	}
}

// Where the controller's queue has no priorities, a woken request is
// still queued.
func TestWokenRequestIsQueuedWithoutPriorities(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	wakeHandler().Generic(context.Background(), wakeEvent("parked"), q)
	if q.Len() != 1 {
		t.Fatalf("%d items queued, want 1", q.Len())
	}
	if item, _ := q.Get(); item != queued("parked") {
		t.Fatalf("queued %v, want ns/parked", item)
	}
}

// Whatever priority brought a pass, its result queues the request again at
// the default one: controller-runtime keeps the priority an item was taken
// at when the result names none, and a woken request would then recheck
// ahead of new requests for as long as it exists.
func TestPassRequeuesAtTheDefaultPriority(t *testing.T) {
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	failing := errors.New("the API server is away")
	for name, c := range map[string]client.Client{
		"gone": fake.NewClientBuilder().WithScheme(s).Build(),
		"failed read": fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return failing
			},
		}).Build(),
	} {
		r := &ErasureRequestReconciler{Client: c}
		res, err := r.Reconcile(context.Background(), queued("woken"))
		if res.Priority == nil || *res.Priority != 0 {
			t.Errorf("%s: result priority %v, want 0 (the default), whatever the pass was taken at", name, res.Priority)
		}
		if name == "failed read" && !errors.Is(err, failing) {
			t.Errorf("%s: error %v, want the read's", name, err)
		}
	}
}
