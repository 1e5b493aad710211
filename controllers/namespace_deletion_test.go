package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

// A tenant's namespace deleted at once: the API server marks it Terminating
// (and refuses anything new in it), then the namespace controller deletes
// every object in it, Secrets and ConfigMaps with the requests and the
// store, in no order Lethe chooses. envtest runs no namespace controller,
// so the test deletes what it would, Secrets first, and waits past the
// manager's Secret cache before the rest: the requests before the store,
// and the store before the requests. The request in its grace period must
// still lift its tombstones, the store must be released, and then its
// Secret: nothing may wait for good.
func TestANamespaceDeletedAtOnceReleasesItsRequestsStoreAndSecret(t *testing.T) {
	t.Run("requests first", func(t *testing.T) { namespaceDeletedAtOnce(t, false) })
	t.Run("store first", func(t *testing.T) { namespaceDeletedAtOnce(t, true) })
}

func namespaceDeletedAtOnce(t *testing.T, storeFirst bool) {
	ctx := context.Background()
	e := newMemoryEnv(t, "ns-gone")
	waitHeld(t, e.store, "pg")

	done := e.request(t, "done", func(er *lethev1.ErasureRequest) { er.Spec.SessionIDs = []lethev1.SessionID{erasedA} })
	waitPhase(t, done, lethev1.PhaseBackupsRotated)
	typo := e.request(t, "typo", func(er *lethev1.ErasureRequest) {
		er.Spec.SessionIDs = []lethev1.SessionID{erasedA2}
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, typo, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = $1 AND tombstoned_at IS NOT NULL`, erasedA2); n != 1 {
		t.Fatalf("the request in its grace period tombstoned %d session(s), want 1: the case this test is about did not happen", n)
	}

	if err := k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}); err != nil {
		t.Fatal(err)
	}
	// What makes a namespace deletion more than deletions: nothing new may
	// be created in it (the store's record, events).
	eventually(t, 10*time.Second, func() error {
		err := k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, GenerateName: "probe-"}})
		if !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return fmt.Errorf("a ConfigMap created in the namespace being deleted: %w", err)
		}
		return nil
	})
	for _, obj := range []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}} {
		if err := k8s.DeleteAllOf(ctx, obj, client.InNamespace(e.ns)); err != nil {
			t.Fatal(err)
		}
	}
	// Past the suite's SecretTTL (5 s): no DSN read before is reused.
	time.Sleep(6 * time.Second)
	if storeFirst {
		if err := k8s.Delete(ctx, e.store); err != nil {
			t.Fatal(err)
		}
		// Past a few of the store's passes (every 0.5 s while it is not
		// Ready), it still waits for its requests.
		time.Sleep(3 * time.Second)
		got := &lethev1.MemoryStore{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(e.store), got); err != nil {
			t.Fatalf("the store went before its requests: %v", err)
		}
		if !slices.Contains(got.Finalizers, controllers.StoreFinalizer) {
			t.Fatalf("the store's first step ended before its requests went: finalizers %v", got.Finalizers)
		}
	}
	if err := k8s.DeleteAllOf(ctx, &lethev1.ErasureRequest{}, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	if !storeFirst {
		if err := k8s.Delete(ctx, e.store); err != nil {
			t.Fatal(err)
		}
	}

	eventually(t, 60*time.Second, func() error {
		if left := namespaceHolds(t, e.ns); len(left) > 0 {
			return fmt.Errorf("the namespace being deleted still holds %v", left)
		}
		return nil
	})

	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
		t.Fatalf("%d session(s) still tombstoned after the namespace went: the request in its grace period was not withdrawn", n)
	}
	if n := e.sessionRows(t, erasedA2); n == 0 {
		t.Fatal("the withdrawn request's session is gone")
	}
	if n := e.sessionRows(t, erasedA); n != 0 {
		t.Fatalf("the completed request's session has %d row(s)", n)
	}
}

// namespaceHolds lists the requests, stores and Secrets left in ns.
func namespaceHolds(t *testing.T, ns string) []string {
	t.Helper()
	var left []string
	for _, l := range []client.ObjectList{&lethev1.ErasureRequestList{}, &lethev1.MemoryStoreList{}, &corev1.SecretList{}} {
		if err := k8s.List(context.Background(), l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		switch l := l.(type) {
		case *lethev1.ErasureRequestList:
			for _, o := range l.Items {
				left = append(left, fmt.Sprintf("ErasureRequest %s (phase %s, finalizers %v)", o.Name, o.Status.Phase, o.Finalizers))
			}
		case *lethev1.MemoryStoreList:
			for _, o := range l.Items {
				left = append(left, fmt.Sprintf("MemoryStore %s (finalizers %v)", o.Name, o.Finalizers))
			}
		case *corev1.SecretList:
			for _, o := range l.Items {
				left = append(left, fmt.Sprintf("Secret %s (finalizers %v)", o.Name, o.Finalizers))
			}
		}
	}
	return left
}

// The store holds each Secret it reads, with a finalizer of its own, and
// only those: a Secret it stops reading is released (another store that
// reads it keeps its own hold), a finalizer removed by hand is put back,
// a gone store's finalizer is taken off, and a deleted store releases the
// rest.
func TestAStoreHoldsTheSecretsItReadsAndReleasesTheRest(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "held")
	waitHeld(t, e.store, "pg")
	createSecret(t, e.ns, "pg2", map[string]string{"dsn": e.dsn})
	other := newStore(e.ns, func(s *lethev1.MemoryStore) { s.Name, s.Spec.TenantID = "other", "t2" })
	if err := k8s.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, other, "pg")

	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"postgres":{"dsnSecretRef":{"name":"pg2","key":"dsn"}}}}`))
	if err := k8s.Patch(ctx, e.store, patch); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, e.store, "pg2")
	waitReleased(t, e.ns, "pg", e.store)
	if !secretHeldBy(t, e.ns, "pg", other) {
		t.Fatal("Secret pg released by the store that still reads it")
	}

	// A finalizer removed by hand is put back at the next audit.
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "pg2"}, s); err != nil {
		t.Fatal(err)
	}
	s.Finalizers = slices.DeleteFunc(s.Finalizers, func(f string) bool { return f == controllers.SecretFinalizer(e.store) })
	if err := k8s.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, e.store, "pg2")

	// A store gone without releasing a Secret (its finalizers removed by
	// hand) leaves a finalizer only the stores that read the Secret can
	// find: they take it off; a live store's stays.
	gone := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{UID: "00000000-0000-4000-8000-00000000dead"}}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "pg2"}, s); err != nil {
		t.Fatal(err)
	}
	s.Finalizers = append(s.Finalizers, controllers.SecretFinalizer(gone), controllers.SecretFinalizer(other))
	if err := k8s.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, e.ns, "pg2", gone)
	if !secretHeldBy(t, e.ns, "pg2", other) {
		t.Fatal("a live store's finalizer was taken off as an orphan")
	}

	if err := k8s.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, e.ns, "pg", other)
	// other never read pg2: its finalizer there is an orphan once it is gone.
	waitReleased(t, e.ns, "pg2", other)
	if err := k8s.Delete(ctx, e.store); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, e.ns, "pg2", e.store)
	for _, name := range []string{"pg", "pg2"} {
		got := &corev1.Secret{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if len(got.Finalizers) != 0 {
			t.Errorf("Secret %s keeps finalizers %v once no store reads it", name, got.Finalizers)
		}
	}
}

// waitHeld waits until the store's status lists exactly the Secret name as
// held and the Secret carries the store's finalizer.
func waitHeld(t *testing.T, store *lethev1.MemoryStore, name string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		got := &lethev1.MemoryStore{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(store), got); err != nil {
			return err
		}
		if !slices.Equal(got.Status.HeldSecrets, []string{name}) {
			return fmt.Errorf("store %s holds %v, want [%s]", store.Name, got.Status.HeldSecrets, name)
		}
		if !secretHeldBy(t, store.Namespace, name, got) {
			return fmt.Errorf("Secret %s lacks the finalizer %s", name, controllers.SecretFinalizer(got))
		}
		return nil
	})
}

// waitReleased waits until the Secret no longer carries the store's
// finalizer.
func waitReleased(t *testing.T, ns, name string, store *lethev1.MemoryStore) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		if secretHeldBy(t, ns, name, store) {
			return fmt.Errorf("Secret %s still carries %s", name, controllers.SecretFinalizer(store))
		}
		return nil
	})
}

func secretHeldBy(t *testing.T, ns, name string, store *lethev1.MemoryStore) bool {
	t.Helper()
	if store.UID == "" {
		t.Fatalf("store %s has no UID: read it from the API server first", store.Name)
	}
	s := &corev1.Secret{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, s); err != nil {
		t.Fatalf("Secret %s: %v", name, err)
	}
	return slices.Contains(s.Finalizers, controllers.SecretFinalizer(store))
}
