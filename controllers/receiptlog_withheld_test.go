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

var (
	logConsistent = &metav1.Condition{Type: lethev1.MemoryStoreReceiptLogConsistent, Status: metav1.ConditionTrue,
		Reason: lethev1.ReasonLogExtendsCheckpoints}
	logForkedCondition = &metav1.Condition{Type: lethev1.MemoryStoreReceiptLogConsistent, Status: metav1.ConditionFalse,
		Reason: lethev1.ReasonReceiptLogInconsistent}
)

// storeWith is a store whose ReceiptLogConsistent condition is cond.
func storeWith(uid types.UID, cond *metav1.Condition) *lethev1.MemoryStore {
	s := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "store-" + string(uid), UID: uid}}
	meta.SetStatusCondition(&s.Status.Conditions, *cond)
	return s
}

// An audit whose status says the store's receipt log extends the held
// checkpoints wakes the requests whose inclusion a pass left out for that
// store, each once, and no other store's; one that says otherwise wakes
// none. The requests come from what the passes recorded, not from the
// cache (which keeps too little of a completed request to tell). A
// request the full queue could not take is woken by the next audit.
func TestTheStoreWakesTheRequestsWhoseInclusionWasWithheld(t *testing.T) {
	for _, tc := range []struct {
		name string
		now  *metav1.Condition
		want []string
	}{
		{"consistent", logConsistent, []string{"first", "second"}},
		{"not consistent", logForkedCondition, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &WithheldInclusions{}
			w.withhold("store-a", "uid-1", types.NamespacedName{Namespace: "ns", Name: "first"}, 4)
			w.withhold("store-a", "uid-2", types.NamespacedName{Namespace: "ns", Name: "second"}, 5)
			w.withhold("store-b", "uid-3", types.NamespacedName{Namespace: "ns", Name: "other"}, 4)
			w.withhold("store-a", "uid-4", types.NamespacedName{Namespace: "ns", Name: "written"}, 4)
			w.forget("uid-4") // its inclusion was written since
			ch := make(chan event.TypedGenericEvent[client.Object], 1)
			r := &MemoryStoreReconciler{Reverify: ch, Withheld: w}
			var got []string
			for range 3 { // the queue takes one a time: three audits
				r.wakeUnlogged(storeWith("store-a", tc.now))
				select {
				case e := <-ch:
					got = append(got, e.Object.GetName())
				default:
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("woke %v, want %v", got, tc.want)
			}
			if _, ok := w.length("uid-3"); !ok {
				t.Fatal("another store's withheld request was dropped")
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
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	cached := storeWith("store-a", logForkedCondition)
	server := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&lethev1.MemoryStore{}).WithObjects(cached.DeepCopy()).Build()
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", UID: "uid-1"}}
	er.Status.History = make([]lethev1.HistoryEntry, 4)
	r := &ErasureRequestReconciler{APIReader: server, Withheld: &WithheldInclusions{}}
	if r.stillWithheld(ctx, cached, er) {
		t.Fatal("a request never withheld skips its inclusion")
	}
	r.Withheld.withhold(cached.UID, er.UID, client.ObjectKeyFromObject(er), len(er.Status.History))
	if !r.stillWithheld(ctx, cached, er) {
		t.Fatal("a withheld request retries while the store says its log is forked")
	}
	longer := er.DeepCopy()
	longer.Status.History = append(longer.Status.History, lethev1.HistoryEntry{})
	if r.stillWithheld(ctx, cached, longer) {
		t.Fatal("a history grown since the inclusion was withheld skips its inclusion")
	}
	// The audit's new status is in the API server, not yet in the cached store.
	fresh := &lethev1.MemoryStore{}
	if err := server.Get(ctx, client.ObjectKeyFromObject(cached), fresh); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&fresh.Status.Conditions, *logConsistent)
	if err := server.Status().Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if r.stillWithheld(ctx, cached, er) {
		t.Fatal("a withheld request skips its inclusion on a cached store older than the audit that found the log consistent")
	}
}
