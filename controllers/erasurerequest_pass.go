package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/metrics"
)

// pass is the state of one reconcile of a request.
type pass struct {
	// req is the request with this pass's outcomes applied; before is the
	// version the status patch is computed (and optimistically locked) against.
	req, before *lethev1.ErasureRequest
	// gone: the pass deleted the request, so there is no status to write.
	gone bool
	// key signs the history entries the pass appends (nil: unsigned).
	key *evidence.Key
	// keyErr: a signing key is configured but cannot be read; the pass
	// only says so.
	keyErr error
	// written holds the outcomes' Persisted callbacks, called once the
	// pass's status write holds.
	written []func()
	// mirror: the pass completed the request or added to its completed
	// history; once its status write holds, the proof is mirrored through
	// this scope, in this pass rather than a pass of its own.
	mirror *erasure.Scope
}

// scope resolves the request's store and opens its ports; when that is not
// possible it returns the outcome that says why.
func (r *ErasureRequestReconciler) scope(ctx context.Context, p *pass) (*erasure.Scope, *erasure.Outcome) {
	er := p.req
	store := &lethev1.MemoryStore{}
	key := types.NamespacedName{Namespace: er.Namespace, Name: er.Spec.StoreRef.Name}
	if err := r.Client.Get(ctx, key, store); err != nil {
		out := erasure.Outcome{Kind: erasure.Errored, Err: err}
		if apierrors.IsNotFound(err) {
			out = erasure.Outcome{Kind: erasure.Waiting, RequeueAfter: r.RetryAfter}
			if er.Status.Phase == lethev1.PhaseBackupsRotated {
				// A completed request kept as evidence after its store went
				// re-verifies at its own interval, not at the retry's: each
				// pass reads it uncached, and thousands of them would crowd
				// the API server.
				out.RequeueAfter = r.ReverifyInterval
			}
			if !meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionTombstoned) {
				out.Kind = erasure.Stalled
				out.Condition = &erasure.Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonStoreNotFound,
					Message: fmt.Sprintf("MemoryStore %q not found in namespace %s", key.Name, key.Namespace)}
			}
		}
		return nil, &out
	}
	if !store.DeletionTimestamp.IsZero() && !meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionTombstoned) {
		// A store being deleted takes no new tombstone: it goes once its
		// requests are done, and one tombstoning now could outlive it.
		return nil, &erasure.Outcome{Kind: erasure.Stalled, RequeueAfter: r.RetryAfter,
			Condition: &erasure.Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonStoreNotFound,
				Message: fmt.Sprintf("MemoryStore %q is being deleted: it takes no new request", key.Name)}}
	}
	ports, err := r.Connector.Ports(ctx, store)
	if err != nil {
		return nil, r.unreachable(er, err)
	}
	ports.Clock = r.Clock
	ports.Claims = &claims{r: r, p: p}
	return &erasure.Scope{Request: er, Store: store, Ports: ports}, nil
}

// unreachable is the outcome of a memory database that cannot be opened,
// reported on the step the request is on.
func (r *ErasureRequestReconciler) unreachable(er *lethev1.ErasureRequest, err error) *erasure.Outcome {
	step := erasure.FirstPending(er)
	var ce *erasure.ConfigError
	if errors.As(err, &ce) {
		return &erasure.Outcome{Kind: erasure.Waiting, RequeueAfter: r.RetryAfter, Condition: stepCondition(step,
			lethev1.ReasonDatabaseUnavailable, "the memory database cannot be reached: "+ce.Message)}
	}
	return &erasure.Outcome{Kind: erasure.Errored, Err: err, Condition: stepCondition(step,
		lethev1.ReasonDatabaseUnavailable, "the memory database is unreachable; Lethe retries")}
}

// stepCondition is a False condition on step, none when every step is done
// (a completed step stays completed).
func stepCondition(step, reason, message string) *erasure.Condition {
	if step == "none" {
		return nil
	}
	return &erasure.Condition{Type: step, Reason: reason, Message: message}
}

// record applies one outcome: the status (through erasure.Record), the
// events and the metrics. It is the only writer of them.
func (r *ErasureRequestReconciler) record(p *pass, out erasure.Outcome) {
	er := p.req
	if m := out.Milestone; m != nil {
		if h := er.Status.History; len(h) > 0 && m.Event != lethev1.ReasonResurrected {
			metrics.StepDuration.WithLabelValues(string(m.Phase)).Observe(max(0, m.At.Sub(h[len(h)-1].Time.Time).Seconds()))
		}
	}
	erasure.Record(er, out, r.Clock.Now(), p.key)
	if out.Persisted != nil {
		p.written = append(p.written, out.Persisted)
	}
	if w := out.Warning; w != nil {
		r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, w.Reason, w.Action, "%s", w.Note)
	}
	if m := out.Milestone; m != nil && milestoneEvent(m, p.req) {
		reason := string(m.Phase)
		if m.Event != "" {
			reason = m.Event
		}
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, reason, "Erase", "%s", m.Note)
	}
	countWork(out.Work)
}

// milestoneEvent reports whether a milestone of er gets an event of its
// own: the start when it opens an undo window (Tombstoned with a grace
// period: the sessions are hidden and the request can still be cancelled),
// the ends (Planned, Cancelled) and a resurrection. The steps between are
// in the signed history; a completed request's closing event is its
// receipt's, which sums it up (an event per step cost four more API calls
// per request; an immediate request's start, one more).
func milestoneEvent(m *erasure.Milestone, er *lethev1.ErasureRequest) bool {
	switch m.Phase {
	case lethev1.PhaseTombstoned:
		return erasure.LedgerRequest(er).Grace > 0
	case lethev1.PhaseCancelled, lethev1.PhasePlanned:
		return true
	}
	return m.Event == lethev1.ReasonResurrected
}

// result turns an outcome into what controller-runtime is told: an error
// (retried with backoff, counted in controller_runtime_reconcile_errors_total)
// or when to look again.
func (r *ErasureRequestReconciler) result(ctx context.Context, step string, out erasure.Outcome) (ctrl.Result, error) {
	if out.Kind == erasure.Errored {
		ctrl.LoggerFrom(ctx).V(1).Info("step failed; controller-runtime retries with backoff", "step", step)
		return ctrl.Result{}, fmt.Errorf("step %s: %w", step, out.Err)
	}
	return ctrl.Result{RequeueAfter: out.RequeueAfter}, nil
}

// patchStatus derives phase, Ready, Stalled and Reconciling, then writes the
// status once if it changed. Optimistic: a pass that started from a stale
// cache must not overwrite a newer status; it gets a conflict and runs again.
func (r *ErasureRequestReconciler) patchStatus(ctx context.Context, p *pass) error {
	erasure.Summarize(p.req)
	if equality.Semantic.DeepEqual(p.before.Status, p.req.Status) {
		return nil
	}
	return r.Client.Status().Patch(ctx, p.req, client.MergeFromWithOptions(p.before, client.MergeFromWithOptimisticLock{}))
}

// claims is the pass's erasure.Claims. The claim is written on the version
// the pass started from, optimistically locked: written, it proves that
// version was the latest, so a cancel the cache had not shown yet makes the
// claim fail instead of losing. Only a pass that sees a cancel reads the
// request uncached first: another pass may have claimed it since.
type claims struct {
	r *ErasureRequestReconciler
	p *pass
	// base is the version the claim is written on; set by CancelRequested.
	base *lethev1.ErasureRequest
	// stale: the pass saw a cancel but started from an older version than
	// the latest. It may not see a claim another pass wrote since, so it
	// neither cancels nor claims: the pass starts again from the latest.
	stale bool
}

func (c *claims) CancelRequested(ctx context.Context) (bool, error) {
	if !c.p.before.Spec.Cancel {
		// Not cancelled as of the pass's version; if a cancel came after
		// it, the claim's write on it gets a conflict.
		c.base = c.p.before
		return false, nil
	}
	latest := &lethev1.ErasureRequest{}
	if err := c.r.APIReader.Get(ctx, client.ObjectKeyFromObject(c.p.req), latest); err != nil {
		return false, err
	}
	c.base = latest
	c.stale = latest.ResourceVersion != c.p.before.ResourceVersion
	return latest.Spec.Cancel && !c.stale, nil
}

func (c *claims) Claim(ctx context.Context, claim metav1.Condition) (bool, error) {
	if c.base == nil {
		return false, errors.New("claim before asking whether the request is cancelled")
	}
	if c.stale {
		return false, nil
	}
	c.r.record(c.p, erasure.Outcome{Condition: &erasure.Condition{Type: claim.Type, OK: claim.Status == metav1.ConditionTrue,
		Reason: claim.Reason, Message: claim.Message}})
	// Summarized as the pass's last write would be: a pass that ends right
	// after the claim (its deletion waits for the vacuum) then writes nothing more.
	erasure.Summarize(c.p.req)
	base := c.base.DeepCopy()
	written := c.base.DeepCopy()
	written.Status = *c.p.req.Status.DeepCopy()
	if err := c.r.Client.Status().Patch(ctx, written, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return false, err
	}
	// The claim is written: later changes of this pass patch on top of it.
	c.p.before = written.DeepCopy()
	c.p.req.ResourceVersion = written.ResourceVersion
	return true, nil
}

// countWork adds what a pass did to the metrics.
func countWork(w erasure.Work) {
	if w.Mode != "" {
		metrics.TombstoneReaper.WithLabelValues(w.Mode).Add(float64(w.SessionsDeleted))
		metrics.TombstoneReaperRows.Add(float64(w.SessionsDeleted))
	}
	for _, c := range w.RowsDeleted {
		metrics.RowsDeleted.WithLabelValues(c.Table).Add(float64(c.Rows))
	}
	if w.GraphPruned.Total() > 0 {
		metrics.GraphPruned.WithLabelValues("nodes").Add(float64(w.GraphPruned.NodeTotal()))
		metrics.GraphPruned.WithLabelValues("relationships").Add(float64(w.GraphPruned.RelationshipTotal()))
	}
	for _, b := range w.Backups {
		switch {
		case !b.Changed:
		case b.DeleteRequest != "":
			metrics.BackupWork.WithLabelValues("delete_requested").Inc()
		default:
			metrics.BackupWork.WithLabelValues("shortened").Inc()
		}
	}
}

func mtime(t time.Time) *metav1.Time {
	m := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &m
}
