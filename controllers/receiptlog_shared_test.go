package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// Two tenants' stores over one memory database (one MemoryStore per
// tenant, each in its namespace) each keep their own receipt log there:
// their requests complete in turn, each receipt gets an index in its own
// store's log, and the auditor's check of each store (kubectl erasure
// receipts) verifies its log, its checkpoints and its proofs only.
func TestStoresSharingADatabaseEachVerifyTheirOwnReceiptLog(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "sharedlog")
	ns2 := newNamespace(t, "sharedlog-t2")
	createSecret(t, ns2, "pg", map[string]string{"dsn": e.dsn})
	store2 := newStore(ns2, func(s *lethev1.MemoryStore) { s.Spec.TenantID = "t2" })
	if err := k8s.Create(ctx, store2); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store2, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	only := func(store *lethev1.MemoryStore, id string) func(*lethev1.ErasureRequest) {
		return func(o *lethev1.ErasureRequest) {
			o.Namespace, o.Spec.StoreRef.Name = store.Namespace, store.Name
			o.Spec.SessionIDs = []lethev1.SessionID{lethev1.SessionID(id)}
		}
	}
	first := e.request(t, "first", only(e.store, erasedA))
	completedWithLog(t, first)
	other := e.request(t, "other", only(store2, otherT2))
	completedWithLog(t, other)
	second := e.request(t, "second", only(e.store, erasedA2))
	completedWithLog(t, second)
	for er, want := range map[*lethev1.ErasureRequest]int64{first: 0, other: 0, second: 1} {
		if got := er.Status.Receipt.Log.Index; got != want {
			t.Errorf("request %s/%s is leaf %d of its store's log, want %d", er.Namespace, er.Name, got, want)
		}
	}
	for _, tc := range []struct {
		store       *lethev1.MemoryStore
		mine, other []*lethev1.ErasureRequest
	}{{e.store, []*lethev1.ErasureRequest{first, second}, []*lethev1.ErasureRequest{other}}, {store2, []*lethev1.ErasureRequest{other}, []*lethev1.ErasureRequest{first, second}}} {
		out, err := kubectlErasure(t, tc.store.Namespace, "receipts", "--store", tc.store.Name)
		if err != nil || !strings.Contains(out, "verified") {
			t.Fatalf("receipts of store %s/%s: %v\n%s", tc.store.Namespace, tc.store.Name, err, out)
		}
		for _, er := range tc.mine {
			if !strings.Contains(out, string(er.UID)) {
				t.Errorf("receipts of store %s/%s does not list its request %s\n%s", tc.store.Namespace, tc.store.Name, er.Name, out)
			}
		}
		for _, er := range tc.other {
			if strings.Contains(out, string(er.UID)) {
				t.Errorf("receipts of store %s/%s lists the other store's request %s\n%s", tc.store.Namespace, tc.store.Name, er.Name, out)
			}
		}
	}
}

// A store deleted and created again under its name is a new store (a new
// UID, a new log). A request it completed before keeps its inclusion in the
// old store's log, which the new store cannot hold it against; its next
// pass writes its receipt into the new store's log and records that
// inclusion, and the auditor's check of the new store verifies.
func TestARequestGoesOnInTheLogOfItsStoreCreatedAgain(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "recreated")
	er := e.request(t, "forget", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA} })
	completedWithLog(t, er)
	oldOrigin := receiptlog.Origin(string(e.store.UID))
	if first, _, _ := strings.Cut(er.Status.Receipt.Log.Checkpoint, "\n"); first != oldOrigin {
		t.Fatalf("the inclusion is of %q, want the store's log %q", first, oldOrigin)
	}
	if err := k8s.Delete(ctx, e.store); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(e.store), &lethev1.MemoryStore{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the store is not gone yet (%w)", err)
		}
		return nil
	})
	again := newStore(e.ns, func(s *lethev1.MemoryStore) { s.Name, s.Spec.TenantID = e.store.Name, "t1" })
	if err := k8s.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, again, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	newOrigin := receiptlog.Origin(string(again.UID))
	nudge(t, er)
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if first, _, _ := strings.Cut(er.Status.Receipt.Log.Checkpoint, "\n"); first != newOrigin {
			return fmt.Errorf("the inclusion is of %q, want the new store's log", first)
		}
		return nil
	})
	if n := e.count(t, `SELECT count(*) FROM lethe.receipt_log WHERE request_uid = $1`, string(er.UID)); n != 2 {
		t.Errorf("%d leaves of the request, want 2: one in each store's log", n)
	}
	if out, err := kubectlErasure(t, e.ns, "receipts", "--store", again.Name); err != nil || !strings.Contains(out, "verified") || !strings.Contains(out, string(er.UID)) {
		t.Fatalf("receipts of the store created again: %v\n%s", err, out)
	}
}
