package controllers_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
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
