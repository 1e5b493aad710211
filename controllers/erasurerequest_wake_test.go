package controllers

import (
	"context"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// cacheAt is a cache that holds every request at resourceVersion rv, or
// none when gone.
type cacheAt struct {
	client.Client
	mu   sync.Mutex
	rv   string
	gone bool
}

func (c *cacheAt) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return apierrors.NewNotFound(lethev1.GroupVersion.WithResource("erasurerequests").GroupResource(), key.Name)
	}
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	obj.SetResourceVersion(c.rv)
	return nil
}

func (c *cacheAt) set(rv string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rv = rv
}

// wokenWithin reports whether r sends a wake within d.
func wokenWithin(r *ErasureRequestReconciler, d time.Duration) bool {
	select {
	case <-r.wakes:
		return true
	case <-time.After(d):
		return false
	}
}

// The wake waits for the cache to hold the parking pass's write: a pass
// woken before would start from the older version and be refused its write.
func TestWakeWaitsForTheCacheToHoldThePassWrite(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cache := &cacheAt{rv: "10"}
	r := &ErasureRequestReconciler{Client: cache, wakes: make(chan event.TypedGenericEvent[client.Object], 1), cacheWait: time.Hour}
	done := make(chan struct{})
	r.wakeOn(ctx, done, wakeEvent("parked").Object.(*lethev1.ErasureRequest), "11")
	if wokenWithin(r, 200*time.Millisecond) {
		t.Fatal("woken before the work it waits on ended")
	}
	close(done)
	if wokenWithin(r, 300*time.Millisecond) {
		t.Fatal("woken while the cache still held the version before the pass's write")
	}
	cache.set("11")
	if !wokenWithin(r, 5*time.Second) {
		t.Fatal("not woken once the cache held the pass's write")
	}
}

// The wake does not wait for the cache when the pass's write failed (its
// conflict already brings a pass), nor for a request gone from it, nor
// past its bound.
func TestWakeWaitsNoLongerThanItNeeds(t *testing.T) {
	for _, c := range []struct {
		name, written string
		cache         *cacheAt
		wait          time.Duration
	}{
		{"write failed", "", &cacheAt{rv: "10"}, time.Hour},
		{"request gone", "11", &cacheAt{gone: true}, time.Hour},
		{"bound reached", "11", &cacheAt{rv: "12"}, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := &ErasureRequestReconciler{Client: c.cache, wakes: make(chan event.TypedGenericEvent[client.Object], 1), cacheWait: c.wait}
			done := make(chan struct{})
			close(done)
			r.wakeOn(ctx, done, wakeEvent("parked").Object.(*lethev1.ErasureRequest), c.written)
			if !wokenWithin(r, 5*time.Second) {
				t.Fatal("not woken")
			}
		})
	}
}
