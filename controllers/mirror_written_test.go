package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// mirrorFixture is a request in a fake API server, a pass over it that
// completed it (its receipt issued, not written yet), and a log of the
// status writes and mirrors, in order.
type mirrorFixture struct {
	c        client.Client
	r        *ErasureRequestReconciler
	p        *pass
	recorder *events.FakeRecorder
	log      *[]string
}

func newMirrorFixture(t *testing.T, mirrorErr error) mirrorFixture {
	t.Helper()
	base := fakeServerWith(t, func(er *lethev1.ErasureRequest) {
		er.Status.History = []lethev1.HistoryEntry{{Phase: lethev1.PhaseTombstoned, Time: metav1.NewTime(time.Unix(1_800_000_000, 0))}}
	})
	key := client.ObjectKey{Namespace: "ns", Name: "r"}
	var log []string
	c := interceptor.NewClient(base, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			err := cl.SubResource(sub).Patch(ctx, obj, patch, opts...)
			if err == nil {
				log = append(log, "status written")
			}
			return err
		},
	})
	recorder := events.NewFakeRecorder(10)
	r := &ErasureRequestReconciler{Client: c, APIReader: c, Clock: clock.RealClock{}, Recorder: recorder}
	seen := &lethev1.ErasureRequest{}
	if err := c.Get(context.Background(), key, seen); err != nil {
		t.Fatal(err)
	}
	ledger := &erasure.LedgerFns{MirrorProofFn: func(ctx context.Context, pr erasure.Proof) (int64, error) {
		// What is mirrored must be what the API server holds.
		held := &lethev1.ErasureRequest{}
		if err := base.Get(ctx, key, held); err != nil {
			return 0, err
		}
		if held.Status.Receipt == nil || len(held.Status.History) != len(pr.History) {
			log = append(log, "mirrored what the API server does not hold")
			return 0, nil
		}
		if mirrorErr != nil {
			return 0, mirrorErr
		}
		log = append(log, "mirrored")
		return -1, nil
	}}
	p := &pass{req: seen.DeepCopy(), before: seen.DeepCopy()}
	if err := r.issueReceipt(context.Background(), p.req); err != nil {
		t.Fatal(err)
	}
	<-recorder.Events // the receipt's own event
	p.mirror = &erasure.Scope{Request: p.req, Ports: erasure.Ports{Ledger: ledger}}
	return mirrorFixture{c: c, r: r, p: p, recorder: recorder, log: &log}
}

// The pass that completes a request mirrors its proof once its status
// write holds, not in a pass of its own; its recheck stays as it was.
func TestTheCompletingPassMirrorsAfterItsWrite(t *testing.T) {
	f := newMirrorFixture(t, nil)
	res, err := ctrl.Result{RequeueAfter: time.Hour}, error(nil)
	f.r.finishPass(context.Background(), f.p, &res, &err)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(*f.log, ", "); got != "status written, mirrored" {
		t.Fatalf("the pass did: %s; want the status written, then the proof mirrored", got)
	}
	if res.RequeueAfter != time.Hour {
		t.Fatalf("requeued after %s, want the recheck (1h) unchanged", res.RequeueAfter)
	}
}

// A status write that fails mirrors nothing: the database never holds a
// proof the API server does not.
func TestALostStatusWriteMirrorsNothing(t *testing.T) {
	f := newMirrorFixture(t, nil)
	moved := &lethev1.ErasureRequest{}
	ctx := context.Background()
	if err := f.c.Get(ctx, client.ObjectKeyFromObject(f.p.req), moved); err != nil {
		t.Fatal(err)
	}
	moved.Status.Phase = lethev1.PhaseGracePeriod
	if err := f.c.Status().Update(ctx, moved); err != nil {
		t.Fatal(err)
	}
	*f.log = nil
	res, err := ctrl.Result{RequeueAfter: time.Hour}, error(nil)
	f.r.finishPass(ctx, f.p, &res, &err)
	if len(*f.log) != 0 {
		t.Fatalf("after a conflicting status write the pass did: %s; want nothing", strings.Join(*f.log, ", "))
	}
	if err != nil || res.RequeueAfter != time.Second {
		t.Fatalf("result %v, %v; want a quick retry without error", res, err)
	}
}

// A mirror that fails is said, and retried soon rather than at the recheck.
func TestAFailedMirrorAfterTheWriteIsRetriedSoon(t *testing.T) {
	f := newMirrorFixture(t, errors.New("relation lethe.erasure_proofs does not exist"))
	res, err := ctrl.Result{RequeueAfter: time.Hour}, error(nil)
	f.r.finishPass(context.Background(), f.p, &res, &err)
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != mirrorRetry {
		t.Fatalf("requeued after %s, want %s", res.RequeueAfter, mirrorRetry)
	}
	select {
	case e := <-f.recorder.Events:
		if !strings.Contains(e, ReasonProofNotMirrored) {
			t.Fatalf("event %q, want %s", e, ReasonProofNotMirrored)
		}
	default:
		t.Fatal("no event says the proof is not mirrored")
	}
}

// A signed receipt's inclusion written for a shorter history (before a
// re-erasure appended an entry, its status write lost) is recorded again,
// though this process mirrored the longer history already.
func TestLogInclusionMustCoverTheWholeHistory(t *testing.T) {
	er := &lethev1.ErasureRequest{}
	er.Status.History = make([]lethev1.HistoryEntry, 6)
	er.Status.Receipt = &lethev1.Receipt{}
	cases := []struct {
		name string
		log  *lethev1.LogInclusion
		want bool
	}{
		{"none", nil, false},
		{"before the last entry", &lethev1.LogInclusion{HistoryLength: 5}, false},
		{"the whole history", &lethev1.LogInclusion{HistoryLength: 6}, true},
	}
	for _, tc := range cases {
		er.Status.Receipt.Log = tc.log
		if got := logCoversHistory(er); got != tc.want {
			t.Errorf("%s: logCoversHistory = %v, want %v", tc.name, got, tc.want)
		}
	}
}
