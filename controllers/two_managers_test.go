package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/fixture"
)

// A second manager with leader election off runs beside the suite's (as a
// paused leader that wakes up after losing its lease would): both reconcile
// every request at once. The database-side guards let each session be
// deleted once, every request completes, and each history has one Deleted
// entry (R5).
func TestTwoManagersAtOnceDeleteEachSessionOnce(t *testing.T) {
	e := newMemoryEnv(t, "two-managers")
	var seen *readCounter
	stop := startNamespacedRequestManager(t, e.ns, func(mgr ctrl.Manager, conn *connector.Connector) *controllers.ErasureRequestReconciler {
		seen = &readCounter{Client: mgr.GetClient()}
		return &controllers.ErasureRequestReconciler{
			Client: seen, APIReader: mgr.GetAPIReader(), SecretReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorder("lethe-second"),
			Connector: conn,
			BatchSize: 2, ReverifyInterval: time.Second, RetryAfter: 300 * time.Millisecond,
		}
	})
	defer stop()
	// The requests are created only once the second manager reconciles: a
	// request on a store that does not exist shows when it does. Otherwise
	// the suite's manager, already running, can finish every request before
	// the second one has started its workers.
	e.request(t, "warm-up", func(er *lethev1.ErasureRequest) { er.Spec.StoreRef.Name = "no-such-store" })
	eventually(t, 30*time.Second, func() error {
		if seen.requests.Load() == 0 {
			return errors.New("the second manager has not reconciled a request yet")
		}
		return nil
	})
	const requests, perRequest = 8, 3
	var all []string
	for i := 0; i < requests*perRequest; i++ {
		id := fmt.Sprintf("33333333-3333-4333-8333-%012d", i)
		all = append(all, id)
		if err := fixture.Seed(context.Background(), e.conn, fixture.Session{ID: id, Tenant: "t1", Rounds: 1, Text: "x", Seed: 100 + i, NoProfile: true}); err != nil {
			t.Fatal(err)
		}
	}
	keptBefore := e.sessionRows(t, keptB)
	var ers []*lethev1.ErasureRequest
	for r := 0; r < requests; r++ {
		ids := all[r*perRequest : (r+1)*perRequest]
		ers = append(ers, e.request(t, fmt.Sprintf("forget-%d", r), func(er *lethev1.ErasureRequest) {
			er.Spec.SessionIDs = nil
			for _, id := range ids {
				er.Spec.SessionIDs = append(er.Spec.SessionIDs, lethev1.SessionID(id))
			}
		}))
	}
	for _, er := range ers {
		waitPhase(t, er, lethev1.PhaseBackupsRotated)
		deleted := 0
		for _, p := range historyPhases(er) {
			if p == string(lethev1.PhaseDeleted) {
				deleted++
			}
		}
		if deleted != 1 {
			t.Errorf("%s: %d Deleted entries in %v", er.Name, deleted, historyPhases(er))
		}
		// One receipt per batch: 3 sessions in batches of 2.
		if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, string(er.UID)); n != 2 {
			t.Errorf("%s: %d Deleted receipts, want 2", er.Name, n)
		}
		if n := e.count(t, `SELECT coalesce(sum(sessions), 0) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, string(er.UID)); n != perRequest {
			t.Errorf("%s: the receipts count %d deleted sessions, want %d", er.Name, n, perRequest)
		}
	}
	for _, id := range all {
		if n := e.sessionRows(t, id); n != 0 {
			t.Errorf("session %s has %d rows left", id, n)
		}
	}
	// The second manager acted (which one wins each pass is up to timing).
	evs := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), evs, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	by := map[string]int{}
	for _, ev := range evs.Items {
		if ev.Regarding.Name != "warm-up" {
			by[ev.ReportingController]++
		}
	}
	if by["lethe-second"] == 0 {
		t.Errorf("events by reporting controller %v: the second manager did not act", by)
	}
	t.Logf("events by reporting controller: %v", by)
	if n := e.sessionRows(t, keptB); n != keptBefore {
		t.Errorf("the kept session went from %d to %d rows", keptBefore, n)
	}
}

// readCounter counts the ErasureRequests a reconciler reads.
type readCounter struct {
	client.Client
	requests atomic.Int64
}

func (c *readCounter) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*lethev1.ErasureRequest); ok {
		c.requests.Add(1)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}
