package controllers

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/metrics"
)

// sweepInterval is the store's sweepInterval, 168h by default.
func sweepInterval(store *lethev1.MemoryStore) time.Duration {
	return store.Spec.FalkorDB.SweepIntervalOrDefault()
}

// failedSweepRetry is the shortest wait before a failed sweep is tried
// again, and after any sweep before the next pass: a full sweep of a large
// graph that keeps failing (its timeout, a FalkorDB out of memory) must not
// run back to back. The sweep is the weekly backstop; a minute is soon
// enough.
const failedSweepRetry = time.Minute

// sweepWait is how long until the next sweep is due: sweepInterval after
// the last attempt that completed or was refused (a refusal needs a human,
// not a retry loop), the recheck interval after a failed one (at least
// failedSweepRetry).
func (r *MemoryStoreReconciler) sweepWait(store *lethev1.MemoryStore) time.Duration {
	last := store.Status.GraphSweep
	if last == nil {
		return 0
	}
	next := last.StartedAt.Add(sweepInterval(store))
	if last.Result == lethev1.SweepFailed {
		next = last.StartedAt.Add(max(r.RecheckInterval, failedSweepRetry))
	}
	return next.Sub(r.Clock.Now())
}

// waitAfterSweep is how long, after a sweep, until the store's next pass
// sweeps again: sweepWait counts from the sweep's start, so a sweep that
// ran past it (a failed one that took its whole timeout) would leave none,
// and a RequeueAfter of zero is no requeue at all: the store would not be
// audited again until the manager restarts.
func (r *MemoryStoreReconciler) waitAfterSweep(store *lethev1.MemoryStore) time.Duration {
	return max(r.sweepWait(store), failedSweepRetry)
}

// sweep runs the full reconciliation of the store's graph from Postgres and
// records it in status.graphSweep (and status.lastSweep when it completed).
func (r *MemoryStoreReconciler) sweep(ctx context.Context, store *lethev1.MemoryStore) {
	log := ctrl.LoggerFrom(ctx)
	started := r.Clock.Now()
	st := &lethev1.GraphSweepStatus{StartedAt: metav1.NewTime(started)}
	store.Status.GraphSweep = st
	sctx, cancel := context.WithTimeout(ctx, r.SweepTimeout)
	defer cancel()
	res, err := r.Connector.Sweep(sctx, store, graph.SweepOptions{MaxOrphanFraction: r.SweepMaxOrphanFraction})
	st.SessionsChecked, st.FactsChecked = int64(res.SessionsChecked), int64(res.FactsChecked)
	st.OrphanSessions, st.OrphanFacts = int64(res.OrphanSessions), int64(res.OrphanFacts)
	st.ProvenancelessNodes, st.ProvenancelessRelationships = res.ProvenancelessNodes, res.ProvenancelessRelationships
	for _, kc := range res.Removed.Keys() {
		st.Removed = append(st.Removed, lethev1.TableCount{Table: kc.Key, Rows: kc.Count})
	}
	metrics.GraphSweepRemoved.WithLabelValues("nodes").Add(float64(res.Removed.NodeTotal()))
	metrics.GraphSweepRemoved.WithLabelValues("relationships").Add(float64(res.Removed.RelationshipTotal()))
	done := r.Clock.Now()
	switch {
	case errors.Is(err, graph.ErrSweepRefused):
		st.Result, st.Message = lethev1.SweepRefused, err.Error()
		r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, "SweepRefused", "Sweep", "%s", err.Error())
	case err != nil:
		st.Result, st.Message = lethev1.SweepFailed, "the sweep stopped and will be retried: "+err.Error()
		log.Error(err, "graph sweep failed", "removed", res.Removed.Total())
	default:
		st.Result = lethev1.SweepCompleted
		st.CompletedAt = ptrTime(done)
		store.Status.LastSweep = ptrTime(done)
		metrics.GraphSweepLastCompletion.WithLabelValues(store.Namespace, store.Name).Set(float64(done.Unix()))
		// Counts only: the elements themselves may name a data subject.
		metrics.GraphProvenanceless.WithLabelValues(store.Namespace, store.Name, "nodes").Set(float64(res.ProvenancelessNodes))
		metrics.GraphProvenanceless.WithLabelValues(store.Namespace, store.Name, "relationships").Set(float64(res.ProvenancelessRelationships))
		if res.Removed.Total() > 0 {
			r.Recorder.Eventf(store, nil, corev1.EventTypeNormal, "GraphSwept", "Sweep",
				"%d graph element(s) without provenance in Postgres removed (%d orphan session(s), %d orphan fact(s))",
				res.Removed.Total(), res.OrphanSessions, res.OrphanFacts)
		}
	}
	metrics.GraphSweeps.WithLabelValues(st.Result).Inc()
	metrics.GraphSweepDuration.Observe(done.Sub(started).Seconds())
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}
