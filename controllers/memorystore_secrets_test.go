package controllers

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/connector"
)

// secretsFixture is a fake API server holding a store being deleted and
// the Secrets it reads (Secret pg gone already), and a reconciler whose
// connector has no database: any step that needs one panics.
func secretsFixture(t *testing.T, storeFinalizers []string, failPatch func(client.Object) error) (*MemoryStoreReconciler, client.Client, *lethev1.MemoryStore) {
	t.Helper()
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	store := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "store", UID: "u-1",
		Finalizers: storeFinalizers, DeletionTimestamp: &metav1.Time{Time: time.Now()}},
		Spec: lethev1.MemoryStoreSpec{Postgres: lethev1.PostgresSpec{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}},
			FalkorDB: &lethev1.FalkorDBSpec{URLSecretRef: lethev1.SecretKeyRef{Name: "graph", Key: "url"}}},
		Status: lethev1.MemoryStoreStatus{HeldSecrets: []string{"graph", "old", "pg"}}}
	held := func(name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			Finalizers: []string{"example.com/keep", SecretFinalizer(store)}}}
	}
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&lethev1.MemoryStore{}).
		WithObjects(store, held("graph"), held("old")).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if failPatch != nil {
				if err := failPatch(obj); err != nil {
					return err
				}
			}
			return cl.Patch(ctx, obj, patch, opts...)
		}}).Build()
	r := &MemoryStoreReconciler{Client: c, APIReader: c, Connector: &connector.Connector{Secrets: c}, Recorder: events.NewFakeRecorder(10)}
	return r, c, store
}

// Once its requests no longer need it (StoreFinalizer off), a store being
// deleted releases its Secrets and goes without its database: a failure
// after a Secret went (a namespace being deleted takes it at once) is
// retried from there, not from the reap that needs the database.
func TestAStoreReleasedPastItsRequestsNeedsNoDatabase(t *testing.T) {
	ctx := context.Background()
	failed := false
	r, c, store := secretsFixture(t, []string{StoreSecretsFinalizer}, func(obj client.Object) error {
		if _, ok := obj.(*lethev1.MemoryStore); ok && !failed {
			failed = true
			return apierrors.NewConflict(lethev1.GroupVersion.WithResource("memorystores").GroupResource(), "store", errors.New("changed"))
		}
		return nil
	})
	if _, err := r.release(ctx, store); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	if !failed {
		t.Fatal("the store's finalizer was never patched")
	}
	for _, name := range []string{"graph", "old"} {
		got := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Finalizers, []string{"example.com/keep"}) {
			t.Errorf("Secret %s keeps finalizers %v, want only the other controller's", name, got.Finalizers)
		}
	}
	again := &lethev1.MemoryStore{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(store), again); err != nil {
		t.Fatal(err)
	}
	if _, err := r.release(ctx, again); err != nil {
		t.Fatalf("second pass: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(store), again); !apierrors.IsNotFound(err) {
		t.Fatalf("the store is still there after its last finalizer went: %v (finalizers %v)", err, again.Finalizers)
	}
}

// A hold is written into the status before the finalizer is put on, so that
// a failure in between leaves nothing the store would not release.
func TestHoldSecretsListsASecretBeforeHoldingIt(t *testing.T) {
	ctx := context.Background()
	var listedWhenPatched []string
	r, c, store := secretsFixture(t, []string{StoreFinalizer, StoreSecretsFinalizer}, nil)
	store.DeletionTimestamp = nil
	store.Status.HeldSecrets = []string{"old"}
	fresh := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"}}
	if err := c.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	r.Client = interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if s, ok := obj.(*corev1.Secret); ok && s.Name == "pg" {
			got := &lethev1.MemoryStore{}
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "store"}, got); err != nil {
				return err
			}
			listedWhenPatched = got.Status.HeldSecrets
			return errors.New("the API server went away")
		}
		return cl.Patch(ctx, obj, patch, opts...)
	}})
	// The server's status names only "old", as this pass reads it (the fake
	// server holds the store as created, being deleted; this pass sees it
	// live).
	onServer := &lethev1.MemoryStore{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(store), onServer); err != nil {
		t.Fatal(err)
	}
	onServer.Status.HeldSecrets = []string{"old"}
	if err := c.Status().Update(ctx, onServer); err != nil {
		t.Fatal(err)
	}
	store.ResourceVersion = onServer.ResourceVersion
	err := r.holdSecrets(ctx, store)
	if err == nil {
		t.Fatal("a failed hold was not reported")
	}
	if !slices.Contains(listedWhenPatched, "pg") {
		t.Fatalf("status.heldSecrets was %v when Secret pg was patched: a failure then leaves a finalizer no status names", listedWhenPatched)
	}
	// "old" is no longer read: released and unlisted; "pg", whose hold
	// failed, stays listed.
	if !slices.Equal(store.Status.HeldSecrets, []string{"graph", "pg"}) {
		t.Errorf("status.heldSecrets %v, want [graph pg]", store.Status.HeldSecrets)
	}
	old := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "old"}, old); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(old.Finalizers, []string{"example.com/keep"}) {
		t.Errorf("Secret old, no longer read, keeps finalizers %v", old.Finalizers)
	}
}

// A pass over a cached store that does not show it is past its first step
// (its Secrets released) holds nothing again: the Secret would keep a
// finalizer no later pass releases.
func TestAStalePassHoldsNothingForAStorePastItsFirstStep(t *testing.T) {
	ctx := context.Background()
	r, c, store := secretsFixture(t, []string{StoreSecretsFinalizer}, nil)
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"}}); err != nil {
		t.Fatal(err)
	}
	stale := store.DeepCopy()
	stale.Finalizers = []string{StoreFinalizer, StoreSecretsFinalizer}
	if err := r.holdSecretsOf(ctx, stale); err != nil {
		t.Fatal(err)
	}
	pg := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "pg"}, pg); err != nil {
		t.Fatal(err)
	}
	if len(pg.Finalizers) != 0 {
		t.Fatalf("Secret pg held again by a store past its first step: %v", pg.Finalizers)
	}
}
