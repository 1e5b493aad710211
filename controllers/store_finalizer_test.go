package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

// A MemoryStore deleted before its requests is held while a request that
// holds tombstones in its database references it: the request, deleted
// afterwards, still lifts them through it; then the store goes.
func TestStoreDeletedBeforeItsRequestsWaitsForThem(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "store-first")
	er := e.request(t, "typo", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n == 0 {
		t.Fatal("no session tombstoned: the case this test is about did not happen")
	}
	if err := k8s.Delete(ctx, e.store); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		if n := storeEvents(t, e.store, controllers.ReasonWaitingForRequests); n == 0 {
			return fmt.Errorf("no %s event on the deleted store", controllers.ReasonWaitingForRequests)
		}
		return nil
	})
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(e.store), &lethev1.MemoryStore{}); err != nil {
		t.Fatalf("the store went while its request held tombstones: %v", err)
	}
	deleteAndWaitGone(t, er)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d session(s) still tombstoned after the request was withdrawn", n)
	}
	eventually(t, 30*time.Second, func() error {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(e.store), &lethev1.MemoryStore{})
		if err == nil {
			return fmt.Errorf("the store still exists once its requests are gone")
		}
		return client.IgnoreNotFound(err)
	})
}
