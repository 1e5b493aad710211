package controllers_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// Crash injection, entirely on the test side: the suite's manager works
// through decorated ports. When a test's hook says so, a port call "crashes"
// at a named point — after its work committed, before it started, or inside
// the deletion transaction (its commit rolls back) — and the status write of
// that pass is lost, as a killed manager's would be.

// crashHook decides whether the pass in namespace crashes at point.
var crashHook atomic.Pointer[func(namespace, point string) bool]

// setCrashHook installs h; the returned function removes it.
func setCrashHook(h func(namespace, point string) bool) (restore func()) {
	crashHook.Store(&h)
	return func() { crashHook.Store(nil) }
}

var errCrash = errors.New("simulated crash")

// crashingConnector decorates the ports of every pass.
type crashingConnector struct {
	inner controllers.Connector
	lost  *lostWrites
}

// pausedNamespaces holds the namespaces whose request passes fail at once
// (as with the manager's erasure work stopped), so a test can watch the
// MemoryStore audit alone.
var pausedNamespaces sync.Map

var errPaused = errors.New("request passes paused by the test")

func (c crashingConnector) Ports(ctx context.Context, store *lethev1.MemoryStore) (erasure.Ports, error) {
	if _, paused := pausedNamespaces.Load(store.Namespace); paused {
		return erasure.Ports{}, errPaused
	}
	c.lost.forget(store.Namespace) // a new pass: the last one's crash is over
	p, err := c.inner.Ports(ctx, store)
	if err != nil {
		return p, err
	}
	if crashHook.Load() != nil {
		c.crashing(&p, store.Namespace)
	}
	if w, ok := mirrorWatches.Load(store.Namespace); ok {
		held, err := receiptHeld(ctx, store.Namespace)
		if err != nil {
			return erasure.Ports{}, err
		}
		p.Ledger = watchedLedger{Ledger: p.Ledger, w: w.(*mirrorWatch), passHadReceipt: held}
	}
	return p, nil
}

// crashing decorates p's ledger and graph to crash where the hook says.
func (c crashingConnector) crashing(p *erasure.Ports, ns string) {
	crash := func(point string) bool {
		h := crashHook.Load()
		if h == nil || !(*h)(ns, point) {
			return false
		}
		c.lost.mark(ns)
		return true
	}
	if e, ok := p.Ledger.(*postgres.Eraser); ok {
		p.Ledger = &crashingLedger{Ledger: &postgres.Eraser{Pool: crashingDB{e.Pool}, Schema: e.Schema, TenantID: e.TenantID}, crash: crash}
	}
	if p.Graph != nil {
		p.Graph = crashingGraph{Graph: p.Graph, crash: crash}
	}
}

// mirrorWatches holds the namespaces whose first mirrored proof is
// watched, each with its *mirrorWatch.
var mirrorWatches sync.Map

// mirrorWatch records whether the pass that first mirrored a proof of its
// namespace began with a receipt already in the API server (a pass after
// the completing one) or without (the completing pass itself).
type mirrorWatch struct {
	mu             sync.Mutex
	mirrored       bool
	passHadReceipt bool
}

func (w *mirrorWatch) first() (mirrored, passHadReceipt bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mirrored, w.passHadReceipt
}

// receiptHeld reports whether a request of ns has a receipt in the API
// server, read uncached at the start of a pass.
func receiptHeld(ctx context.Context, ns string) (bool, error) {
	ers := &lethev1.ErasureRequestList{}
	if err := k8s.List(ctx, ers, client.InNamespace(ns)); err != nil {
		return false, err
	}
	for _, er := range ers.Items {
		if er.Status.Receipt != nil {
			return true, nil
		}
	}
	return false, nil
}

// watchedLedger records its pass's first mirror in w.
type watchedLedger struct {
	erasure.Ledger
	w              *mirrorWatch
	passHadReceipt bool
}

func (l watchedLedger) MirrorProof(ctx context.Context, p erasure.Proof) (int64, error) {
	idx, err := l.Ledger.MirrorProof(ctx, p)
	if err == nil {
		l.w.mu.Lock()
		if !l.w.mirrored {
			l.w.mirrored, l.w.passHadReceipt = true, l.passHadReceipt
		}
		l.w.mu.Unlock()
	}
	return idx, err
}

// crashingLedger crashes around and inside the ledger's transactions.
type crashingLedger struct {
	erasure.Ledger
	crash func(point string) bool
}

func (l *crashingLedger) Tombstone(ctx context.Context, req erasure.Request) (erasure.Plan, error) {
	plan, err := l.Ledger.Tombstone(ctx, req)
	if err == nil && l.crash("after-tombstone-commit") {
		return erasure.Plan{}, errCrash
	}
	return plan, err
}

func (l *crashingLedger) Delete(ctx context.Context, req erasure.Request, batchSize, probeBudget int) (erasure.DeleteResult, error) {
	if l.crash("after-claim") {
		return erasure.DeleteResult{}, errCrash
	}
	if l.crash("inside-delete-transaction") {
		ctx = context.WithValue(ctx, crashCommitKey{}, true)
	}
	res, err := l.Ledger.Delete(ctx, req, batchSize, probeBudget)
	if err == nil && l.crash("after-delete-commit") {
		return erasure.DeleteResult{}, errCrash
	}
	return res, err
}

// ProbeResidue is the step's last database call before its status write.
func (l *crashingLedger) ProbeResidue(ctx context.Context, probe []erasure.Embedding, maxDistance float64) ([]erasure.Residue, error) {
	res, err := l.Ledger.ProbeResidue(ctx, probe, maxDistance)
	if err == nil && l.crash("before-status-write") {
		return nil, errCrash
	}
	return res, err
}

// crashingGraph crashes after a batch was pruned, before its receipt.
type crashingGraph struct {
	erasure.Graph
	crash func(point string) bool
}

func (g crashingGraph) Prune(ctx context.Context, ids []string, limit int) (erasure.GraphCounts, error) {
	removed, err := g.Graph.Prune(ctx, ids, limit)
	if err == nil && g.crash("between-graph-batches") {
		return erasure.GraphCounts{}, errCrash
	}
	return removed, err
}

// crashCommitKey marks a context whose transactions roll back at commit.
type crashCommitKey struct{}

// crashingDB hands out transactions that roll back at commit when their
// context is marked: every statement ran, and none of it took effect.
type crashingDB struct{ postgres.DB }

func (d crashingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := d.DB.BeginTx(ctx, opts)
	if err != nil || ctx.Value(crashCommitKey{}) == nil {
		return tx, err
	}
	return crashingTx{tx}, nil
}

type crashingTx struct{ pgx.Tx }

func (t crashingTx) Commit(ctx context.Context) error {
	if err := t.Rollback(ctx); err != nil {
		return err
	}
	return errCrash
}

// lostStatusWrites drops the status writes of crashed passes, in every
// manager the suite starts.
var lostStatusWrites = &lostWrites{}

// lostWrites drops the status writes of a crashed pass.
type lostWrites struct {
	mu      sync.Mutex
	crashed map[string]bool
	// dropped counts the writes dropped, so a test can see crashes lost some.
	dropped atomic.Int64
	// failLog: namespaces whose first status write carrying a receipt's
	// log inclusion fails (a conflict), as a write can in a living manager.
	failLog map[string]bool
}

// failLogOnce makes the first status write of ns that records a receipt's
// log inclusion fail.
func (l *lostWrites) failLogOnce(ns string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failLog == nil {
		l.failLog = map[string]bool{}
	}
	l.failLog[ns] = true
}

// takeLogFailure reports whether this write of ns, recording a log
// inclusion, is the one to fail.
func (l *lostWrites) takeLogFailure(obj client.Object) bool {
	er, ok := obj.(*lethev1.ErasureRequest)
	if !ok || er.Status.Receipt == nil || er.Status.Receipt.Log == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.failLog[er.Namespace] {
		return false
	}
	delete(l.failLog, er.Namespace)
	return true
}

func (l *lostWrites) mark(ns string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.crashed == nil {
		l.crashed = map[string]bool{}
	}
	l.crashed[ns] = true
}

func (l *lostWrites) forget(ns string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.crashed, ns)
}

func (l *lostWrites) isCrashed(ns string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.crashed[ns]
}

// client wraps c so that a crashed pass's status writes are lost.
func (l *lostWrites) client(c client.Client) client.Client {
	return interceptor.NewClient(noWatch{c}, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if l.isCrashed(obj.GetNamespace()) {
				l.dropped.Add(1)
				return nil
			}
			if l.takeLogFailure(obj) {
				return apierrors.NewConflict(lethev1.GroupVersion.WithResource("erasurerequests").GroupResource(), obj.GetName(),
					errors.New("the test failed this status write"))
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
}

// noWatch lets the manager's client be intercepted (the reconciler never watches through it).
type noWatch struct{ client.Client }

func (noWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("watch is not supported")
}
