package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/storerecord"
)

// A manager that dies right after the tombstone's commit, every time, never
// records Tombstoned; the request is then deleted with its finalizer
// removed by hand, so nothing withdraws it. The store's reaper finds the
// tombstones whose request is gone and lifts them (the deletion never
// started), with a Cancelled receipt, an event and its counter.
func TestReaperLiftsTheTombstonesOfAGoneRequest(t *testing.T) {
	e := newMemoryEnv(t, "reap-lift")
	er := tombstonedByACrashingManager(t, e)
	removeFinalizerAndDelete(t, er)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d sessions tombstoned right after the request went, want 2: the case this test is about did not happen", n)
	}
	eventually(t, 30*time.Second, func() error {
		if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
			return fmt.Errorf("%d sessions still tombstoned though their request is gone", n)
		}
		return nil
	})
	if n := e.sessionRows(t, erasedA); n == 0 {
		t.Error("the reaper deleted a session whose deletion never started")
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Cancelled'`, string(er.UID)); n != 1 {
		t.Errorf("%d Cancelled receipts for the reaped request, want 1", n)
	}
	// The counter is added after the lifting's commit and the event is
	// posted by the recorder's own goroutine: both may come a moment after
	// the sessions read as lifted.
	eventually(t, 10*time.Second, func() error {
		if n := storeEvents(t, e.store, controllers.ReasonTombstonesReaped); n != 1 {
			return fmt.Errorf("%d TombstonesReaped events on the store, want 1", n)
		}
		if v, _ := counterValue(t, "lethe_tombstones_reaped_total", "namespace", e.ns); v != 2 {
			return fmt.Errorf("lethe_tombstones_reaped_total for the store: %v, want 2", v)
		}
		return nil
	})
}

// A deletion that started (one batch committed by a manager that then
// died) and whose request lost its finalizer by hand and went: the reaper
// finishes the deletion — the guard still holds, the receipts keep their
// batch keys — and records it in the store's record.
func TestReaperFinishesTheDeletionOfAGoneRequest(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "reap-finish")
	restore := setCrashHook(func(ns, point string) bool { return ns == e.ns && point == "after-claim" })
	t.Cleanup(restore)
	er := e.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.SessionIDs = append(er.Spec.SessionIDs, keptB)
	})
	waitStepReason(t, er, lethev1.ConditionDeleted, lethev1.ReasonDeleting)
	// The first batch (of 2, sorted) commits, as a manager would have.
	pool, err := postgres.Connect(ctx, e.dsn, postgres.Options{Vector: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	first := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	firstBatch := slices.Sorted(slices.Values([]string{erasedA, erasedA2, keptB}))[:2]
	if _, err := first.Delete(ctx, erasure.Request{UID: string(er.UID), SessionIDs: firstBatch}, 2, 0); err != nil {
		t.Fatal(err)
	}
	removeFinalizerAndDelete(t, er)
	eventually(t, 30*time.Second, func() error {
		if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
			return fmt.Errorf("%d sessions still tombstoned though their request is gone", n)
		}
		return nil
	})
	for _, id := range []string{erasedA, erasedA2, keptB} {
		if n := e.sessionRows(t, id); n != 0 {
			t.Errorf("session %s: %d rows left: the started deletion was not finished", id, n)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, string(er.UID)); n != 2 {
		t.Errorf("%d Deleted receipts, want 2 (one per batch)", n)
	}
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = $1`, otherT2); n != 1 {
		t.Error("the other tenant's session went")
	}
	// The record is written after the deletion, the graph prune first.
	eventually(t, 30*time.Second, func() error {
		if !recorded(t, e, string(er.UID)) {
			return fmt.Errorf("the store's record has no entry for the reaped request")
		}
		return nil
	})
	assertRecordKeepsNoIDs(t, e, string(er.UID))
}

// recorded reports whether the store's record has an entry for uid.
func recorded(t *testing.T, e *memoryEnv, uid string) bool {
	t.Helper()
	cms := &corev1.ConfigMapList{}
	if err := k8s.List(context.Background(), cms, client.InNamespace(e.ns), client.MatchingLabels{storerecord.LabelStore: e.store.Name}); err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if _, ok := cm.Data[uid]; ok {
			return true
		}
	}
	return false
}

// deleteAndWaitGone deletes the request and waits until the API server no longer has it.
func deleteAndWaitGone(t *testing.T, er *lethev1.ErasureRequest) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Delete(ctx, er); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), &lethev1.ErasureRequest{}); err == nil {
			return fmt.Errorf("request still exists")
		} else {
			return client.IgnoreNotFound(err)
		}
	})
}

// removeFinalizerAndDelete does what someone clearing a stuck request by
// hand does: removes its finalizer, then deletes it.
func removeFinalizerAndDelete(t *testing.T, er *lethev1.ErasureRequest) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 10*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		er.Finalizers = nil
		if err := k8s.Update(ctx, er); err != nil {
			return err
		}
		// Deleted at the version without the finalizer: a pass that added
		// it back meanwhile (the request is not being deleted yet) makes
		// the delete conflict, and the removal is done again.
		return k8s.Delete(ctx, er, client.Preconditions{ResourceVersion: &er.ResourceVersion})
	})
	waitRequestGone(t, er)
}

// The same crash, and the request deleted the usual way: its finalizer asks
// the ledger, not the status, and lifts the tombstones at once.
func TestFinalizerDecidesFromTheLedger(t *testing.T) {
	e := newMemoryEnv(t, "final-ledger")
	er := tombstonedByACrashingManager(t, e)
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
		t.Fatal(err)
	}
	if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionTombstoned) {
		t.Fatal("the status says Tombstoned: the crash this test is about did not happen")
	}
	deleteAndWaitGone(t, er)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d sessions still tombstoned right after the request went: the finalizer trusted the status", n)
	}
}

// tombstonedByACrashingManager makes a request (grace one hour) whose
// manager dies right after each tombstone's commit: the sessions are
// tombstoned and the status never says so.
func tombstonedByACrashingManager(t *testing.T, e *memoryEnv) *lethev1.ErasureRequest {
	t.Helper()
	restore := setCrashHook(func(ns, point string) bool { return ns == e.ns && point == "after-tombstone-commit" })
	t.Cleanup(restore)
	er := e.request(t, "typo", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	eventually(t, 20*time.Second, func() error {
		if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 2 {
			return fmt.Errorf("%d sessions tombstoned, want 2", n)
		}
		return nil
	})
	return er
}
