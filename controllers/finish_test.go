package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/backups"
)

// A request deleted right after its deletion (a GitOps prune, a namespace
// clean-up) still rotates its Backups: the finalizer holds, the request
// goes on to BackupsRotated — its Backup shortened to the deadline — and
// only then is the object released, with its receipt issued and the store's
// record kept.
func TestRequestDeletedAfterItsDeletionStillRotatesItsBackups(t *testing.T) {
	ctx := context.Background()
	ve := newVeleroEnv(t, "finish")
	nightly := ve.backup(t, "nightly", ve.app, 90*day) // expires after the deadline: shortened
	er := ve.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Millisecond}
	})
	waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	if b := ve.get(t, "nightly"); !b.Status.Expiration.Before(nightly.Status.Expiration) || backups.ReadSummary(b.Annotations).Count != 1 {
		t.Fatalf("the Backup was not rotated: expiration %s (Velero set %s), annotations %v", b.Status.Expiration, nightly.Status.Expiration, b.Annotations)
	}
	if err := k8s.Delete(ctx, er); err != nil {
		t.Fatal(err)
	}
	// The object stays while its Backup holds the data.
	time.Sleep(3 * time.Second)
	live := &lethev1.ErasureRequest{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), live); err != nil {
		t.Fatalf("the request was released while its Backup still holds the erased data: %v", err)
	}
	if live.Status.Phase == lethev1.PhaseBackupsRotated {
		t.Fatalf("phase %s before the Backup is gone", live.Status.Phase)
	}
	// The pass that sees the deletion says so, once (a busy manager may
	// take longer than the wait above to get to it).
	eventually(t, 30*time.Second, func() error {
		if n := requestEvents(t, live, controllers.ReasonFinishingBeforeRelease); n != 1 {
			return fmt.Errorf("%d FinishingBeforeRelease events, want 1", n)
		}
		return nil
	})
	ve.deleteWithVelero(t, "nightly")
	deleteAndWaitGone(t, er)
	if f := ve.files(t, "nightly"); f != 0 {
		t.Errorf("the request was released with %d file(s) of its Backup in the bucket", f)
	}
	assertRecordKeepsNoIDs(t, ve.memoryEnv, string(er.UID))
}

// requestEvents counts the events with reason on the request.
func requestEvents(t *testing.T, er *lethev1.ErasureRequest, reason string) int {
	t.Helper()
	evs := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), evs, client.InNamespace(er.Namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs.Items {
		if ev.Regarding.Kind == "ErasureRequest" && ev.Regarding.Name == er.Name && ev.Reason == reason {
			n++
		}
	}
	return n
}
