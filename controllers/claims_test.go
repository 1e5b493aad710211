package controllers

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

var deletingClaim = metav1.Condition{Type: lethev1.ConditionDeleted, Status: metav1.ConditionFalse,
	Reason: lethev1.ReasonDeleting, Message: "deletion claimed"}

// claimsFixture is a request in a fake API server, the reconciler's claims
// over it, and the number of uncached reads they made.
type claimsFixture struct {
	c     client.Client
	r     *ErasureRequestReconciler
	reads *int
}

// fakeServerWith is a fake API server (status subresource on) holding an
// immediate request ns/r, shaped by edit.
func fakeServerWith(t *testing.T, edit func(*lethev1.ErasureRequest)) client.WithWatch {
	t.Helper()
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r"},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "store"}, SessionIDs: []lethev1.SessionID{"s-1"}, Immediate: true}}
	if edit != nil {
		edit(er)
	}
	return fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&lethev1.ErasureRequest{}).WithObjects(er).Build()
}

func newClaimsFixture(t *testing.T) claimsFixture {
	t.Helper()
	c := fakeServerWith(t, nil)
	reads := 0
	reader := interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			reads++
			return cl.Get(ctx, key, obj, opts...)
		},
	})
	return claimsFixture{c: c, r: &ErasureRequestReconciler{Client: c, APIReader: reader, Clock: clock.RealClock{}}, reads: &reads}
}

// read is the request as the API server holds it now: what a pass starting
// from a fresh cache sees.
func (f claimsFixture) read(t *testing.T) *lethev1.ErasureRequest {
	t.Helper()
	er := &lethev1.ErasureRequest{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "r"}, er); err != nil {
		t.Fatal(err)
	}
	return er
}

func (f claimsFixture) claimsFrom(seen *lethev1.ErasureRequest) *claims {
	return &claims{r: f.r, p: &pass{req: seen.DeepCopy(), before: seen.DeepCopy()}}
}

// claimed reports whether the API server holds the deletion's claim.
func (f claimsFixture) claimed(t *testing.T) bool {
	t.Helper()
	c := meta.FindStatusCondition(f.read(t).Status.Conditions, lethev1.ConditionDeleted)
	return c != nil && c.Reason == lethev1.ReasonDeleting
}

// A pass whose version is the latest and not cancelled claims without an
// uncached read: the claim's write, locked on that version, is the check.
func TestClaimOnTheLatestVersionNeedsNoUncachedRead(t *testing.T) {
	f := newClaimsFixture(t)
	cl := f.claimsFrom(f.read(t))
	ctx := context.Background()
	if cancel, err := cl.CancelRequested(ctx); err != nil || cancel {
		t.Fatalf("CancelRequested = %v, %v; want false", cancel, err)
	}
	ok, err := cl.Claim(ctx, deletingClaim)
	if err != nil || !ok {
		t.Fatalf("Claim = %v, %v; want claimed", ok, err)
	}
	if !f.claimed(t) {
		t.Fatal("the API server does not hold the claim")
	}
	if latest := f.read(t); cl.p.before.ResourceVersion != latest.ResourceVersion || cl.p.req.ResourceVersion != latest.ResourceVersion {
		t.Fatalf("the pass goes on from version %s/%s, the claim wrote %s", cl.p.before.ResourceVersion, cl.p.req.ResourceVersion, latest.ResourceVersion)
	}
	if *f.reads != 0 {
		t.Fatalf("%d uncached reads, want none", *f.reads)
	}
}

// A cancel the pass's (cached) version does not show yet makes the claim
// fail: nothing is written, and the next pass sees the cancel.
func TestCancelAfterThePassesVersionFailsTheClaim(t *testing.T) {
	f := newClaimsFixture(t)
	ctx := context.Background()
	seen := f.read(t)
	cancelled := seen.DeepCopy()
	cancelled.Spec.Cancel = true
	if err := f.c.Update(ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	cl := f.claimsFrom(seen)
	if cancel, err := cl.CancelRequested(ctx); err != nil || cancel {
		t.Fatalf("CancelRequested on the older version = %v, %v; want false", cancel, err)
	}
	if ok, err := cl.Claim(ctx, deletingClaim); err != nil || ok {
		t.Fatalf("Claim on a version older than the cancel = %v, %v; want refused without error", ok, err)
	}
	if f.claimed(t) {
		t.Fatal("a claim was written over the cancel")
	}
	next := f.claimsFrom(f.read(t))
	if cancel, err := next.CancelRequested(ctx); err != nil || !cancel {
		t.Fatalf("the next pass's CancelRequested = %v, %v; want true", cancel, err)
	}
	if *f.reads != 1 {
		t.Fatalf("%d uncached reads, want 1 (by the pass that sees the cancel)", *f.reads)
	}
}

// A pass that sees a cancel on a version older than the latest neither
// cancels nor claims: another pass may have claimed since.
func TestStaleCancelNeitherCancelsNorClaims(t *testing.T) {
	f := newClaimsFixture(t)
	ctx := context.Background()
	cancelled := f.read(t)
	cancelled.Spec.Cancel = true
	if err := f.c.Update(ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	seen := f.read(t)
	// Another pass writes the request since (its status).
	other := seen.DeepCopy()
	other.Status.Phase = lethev1.PhaseGracePeriod
	if err := f.c.Status().Update(ctx, other); err != nil {
		t.Fatal(err)
	}
	cl := f.claimsFrom(seen)
	if cancel, err := cl.CancelRequested(ctx); err != nil || cancel {
		t.Fatalf("CancelRequested on a stale version = %v, %v; want false", cancel, err)
	}
	if ok, err := cl.Claim(ctx, deletingClaim); err != nil || ok {
		t.Fatalf("Claim on a stale version = %v, %v; want refused", ok, err)
	}
	if f.claimed(t) {
		t.Fatal("a stale pass wrote a claim")
	}
}
