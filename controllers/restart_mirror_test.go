package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// A manager that starts (a restart, an upgrade) gives every completed
// request a pass. The proofs its database already holds are not written
// again: each would re-verify its chain in lethe.record_proof and, signed,
// read the whole receipt log and sign a checkpoint, for thousands of
// requests at once. A proof the database lost is written again.
func TestARestartedManagerWritesOnlyTheProofsTheDatabaseLacks(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "restart-mirror")
	kept := e.request(t, "kept", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA} })
	completedWithLog(t, kept)
	lost := e.request(t, "lost", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA2} })
	completedWithLog(t, lost)
	// The database loses one proof (its leaf in the log stays); the suite's
	// manager mirrored both already, so it does not write it again.
	if _, err := e.conn.Exec(ctx, `DELETE FROM lethe.erasure_proofs WHERE request_uid = $1`, string(lost.UID)); err != nil {
		t.Fatal(err)
	}

	calls := &proofCalls{mirrored: map[string]int{}, held: map[string]int{}}
	stop := startRestartedManager(t, e.ns, calls)
	defer stop()
	eventually(t, 60*time.Second, func() error {
		if n := e.count(t, `SELECT count(*) FROM lethe.erasure_proofs WHERE request_uid = $1`, string(lost.UID)); n != 1 {
			return fmt.Errorf("the lost proof is not back (%d rows)", n)
		}
		if calls.seenOf(kept) == 0 {
			return errors.New("the restarted manager has not reached the kept proof yet")
		}
		return nil
	})
	if n := calls.mirroredOf(kept); n != 0 {
		t.Fatalf("the restarted manager wrote the proof the database held %d time(s); want none", n)
	}
	if n := calls.mirroredOf(lost); n == 0 {
		t.Fatal("the lost proof came back, but not through the restarted manager's mirror")
	}
	// Nor do its later passes (each request's, one per second).
	before := calls.passes()
	eventually(t, 30*time.Second, func() error {
		if calls.passes() < before+4 {
			return errors.New("the restarted manager made no more passes")
		}
		return nil
	})
	if n := calls.mirroredOf(kept); n != 0 {
		t.Fatalf("a later pass wrote the held proof %d time(s)", n)
	}
}

// proofCalls counts, per request UID, the proofs a manager wrote and the
// checks that found one held, and the passes that opened the store's ports.
type proofCalls struct {
	mu             sync.Mutex
	mirrored, held map[string]int
	ports          int // passes that opened the store's ports
}

func (c *proofCalls) passes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ports
}

func (c *proofCalls) mirroredOf(er *lethev1.ErasureRequest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mirrored[string(er.UID)]
}

// seenOf counts the passes that reached the request's proof: written or found held.
func (c *proofCalls) seenOf(er *lethev1.ErasureRequest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[string(er.UID)] + c.mirrored[string(er.UID)]
}

// countingConnector counts the proof calls of every pass's ledger.
type countingConnector struct {
	controllers.Connector
	calls *proofCalls
}

func (c countingConnector) Ports(ctx context.Context, store *lethev1.MemoryStore) (erasure.Ports, error) {
	p, err := c.Connector.Ports(ctx, store)
	c.calls.mu.Lock()
	c.calls.ports++
	c.calls.mu.Unlock()
	if err == nil {
		p.Ledger = countingLedger{Ledger: p.Ledger, calls: c.calls}
	}
	return p, err
}

type countingLedger struct {
	erasure.Ledger
	calls *proofCalls
}

func (l countingLedger) MirrorProof(ctx context.Context, p erasure.Proof) (int64, error) {
	idx, err := l.Ledger.MirrorProof(ctx, p)
	l.calls.mu.Lock()
	l.calls.mirrored[p.UID]++
	l.calls.mu.Unlock()
	return idx, err
}

func (l countingLedger) ProofMirrored(ctx context.Context, p erasure.Proof, index int64) (bool, error) {
	held, err := l.Ledger.ProofMirrored(ctx, p, index)
	if held && err == nil {
		l.calls.mu.Lock()
		l.calls.held[p.UID]++
		l.calls.mu.Unlock()
	}
	return held, err
}

// startRestartedManager starts a second request controller, watching ns
// only, as a manager just started would be: nothing mirrored in this
// process, the suite's signing key. It runs beside the suite's manager.
func startRestartedManager(t *testing.T, ns string, calls *proofCalls) (stop func()) {
	t.Helper()
	return startNamespacedRequestManager(t, ns, func(mgr ctrl.Manager, conn *connector.Connector) *controllers.ErasureRequestReconciler {
		return &controllers.ErasureRequestReconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), SecretReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorder("lethe-restarted"),
			Clock:     operatorClock,
			Connector: countingConnector{Connector: conn, calls: calls},
			BatchSize: 2, ReverifyInterval: time.Second, RetryAfter: 300 * time.Millisecond,
			ReceiptKeySecret: receiptKeySecret, KeyCacheTTL: time.Second,
		}
	})
}
