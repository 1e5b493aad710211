package controllers

import (
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// withheldFixture is a fake API server holding a store and its requests:
// "unlogged" (a signed receipt, no inclusion), "stale" (an inclusion of a
// shorter history), "logged" (an inclusion of its whole history),
// "unsigned" (a receipt without a signature: never logged), "running" (no
// receipt yet) and "other" (unlogged, of another store).
func withheldFixture(t *testing.T, logCondition *metav1.Condition) (client.Client, *lethev1.MemoryStore) {
	t.Helper()
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	store := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "store", UID: "u-1"}}
	if logCondition != nil {
		meta.SetStatusCondition(&store.Status.Conditions, *logCondition)
	}
	req := func(name, storeName string, receipt *lethev1.Receipt) client.Object {
		er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: storeName}}}
		er.Status.History = make([]lethev1.HistoryEntry, 4)
		er.Status.Receipt = receipt
		return er
	}
	signed := func(log *lethev1.LogInclusion) *lethev1.Receipt {
		return &lethev1.Receipt{Digest: "sha256:d", Envelope: "envelope", Log: log}
	}
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&lethev1.MemoryStore{}).WithObjects(store,
		req("unlogged", "store", signed(nil)),
		req("stale", "store", signed(&lethev1.LogInclusion{HistoryLength: 3})),
		req("logged", "store", signed(&lethev1.LogInclusion{HistoryLength: 4})),
		req("unsigned", "store", &lethev1.Receipt{Digest: "sha256:d"}),
		req("running", "store", nil),
		req("other", "another-store", signed(nil)),
	).Build()
	return c, store
}

var (
	logConsistent = &metav1.Condition{Type: lethev1.MemoryStoreReceiptLogConsistent, Status: metav1.ConditionTrue,
		Reason: lethev1.ReasonLogExtendsCheckpoints}
	logForkedCondition = &metav1.Condition{Type: lethev1.MemoryStoreReceiptLogConsistent, Status: metav1.ConditionFalse,
		Reason: lethev1.ReasonReceiptLogInconsistent}
)

// Once a store's status says its receipt log extends the held checkpoints
// again, and only then, the audit wakes each of its requests whose signed
// receipt has no inclusion of its whole history, and no other.
func TestTheStoreWakesItsUnloggedRequestsWhenItsLogIsConsistentAgain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		now     *metav1.Condition
		wasTrue bool
		want    []string
	}{
		{"turned consistent", logConsistent, false, []string{"stale", "unlogged"}},
		{"consistent before", logConsistent, true, nil},
		{"still not consistent", logForkedCondition, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, store := withheldFixture(t, tc.now)
			ch := make(chan event.TypedGenericEvent[client.Object], 10)
			r := &MemoryStoreReconciler{Client: c, Reverify: ch}
			r.wakeUnlogged(context.Background(), store, tc.wasTrue)
			close(ch)
			var got []string
			for e := range ch {
				got = append(got, e.Object.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("woke %v, want %v", got, tc.want)
			}
		})
	}
}

// A request whose inclusion a forked log withheld skips the retry only
// while the store, as the API server has it now, still says its log is
// forked, and only for the history length that was withheld: a cache that
// still says forked after the audit said otherwise does not keep it out.
func TestAWithheldInclusionWaitsOnlyWhileTheStoreSaysTheLogIsForked(t *testing.T) {
	ctx := context.Background()
	c, store := withheldFixture(t, logForkedCondition)
	er := &lethev1.ErasureRequest{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "unlogged"}, er); err != nil {
		t.Fatal(err)
	}
	r := &ErasureRequestReconciler{Client: c, APIReader: c}
	if r.stillWithheld(ctx, store, er) {
		t.Fatal("a request never withheld skips its inclusion")
	}
	r.withheld.Store(er.UID, len(er.Status.History))
	if !r.stillWithheld(ctx, store, er) {
		t.Fatal("a withheld request retries while the store says its log is forked")
	}
	longer := er.DeepCopy()
	longer.Status.History = append(longer.Status.History, lethev1.HistoryEntry{})
	if r.stillWithheld(ctx, store, longer) {
		t.Fatal("a history grown since the inclusion was withheld skips its inclusion")
	}
	// The audit's new status is in the API server, not yet in the cached store.
	fresh := store.DeepCopy()
	meta.SetStatusCondition(&fresh.Status.Conditions, *logConsistent)
	if err := c.Status().Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if r.stillWithheld(ctx, store, er) {
		t.Fatal("a withheld request skips its inclusion on a cached store older than the audit that found the log consistent")
	}
}
