package controllers

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/metrics"
)

// goneEraseChunk bounds the sessions one graph count (and prune) covers.
const goneEraseChunk = 1000

// pruneGoneErasures prunes, at every audit, the graph elements of sessions
// erased by requests whose object is gone (GitOps deleted them once
// complete): a live request re-verifies its own erasure, a gone one no
// longer does, and a derivation job that committed late would keep its
// elements until the next full sweep. Sessions erased more than two sweep
// intervals ago are left to the full sweep, which has run since.
func (r *MemoryStoreReconciler) pruneGoneErasures(ctx context.Context, store *lethev1.MemoryStore) error {
	live, err := r.requestUIDs(ctx)
	if err != nil {
		return err
	}
	since := r.Clock.Now().Add(-2 * sweepInterval(store))
	sessions, removed, err := r.Connector.PruneGoneErasures(ctx, store, slices.Collect(maps.Keys(live)), since, goneEraseChunk, goneEraseChunk)
	if err != nil {
		return err
	}
	if removed.Total() == 0 {
		return nil
	}
	metrics.GraphReappearedPruned.WithLabelValues("nodes").Add(float64(removed.NodeTotal()))
	metrics.GraphReappearedPruned.WithLabelValues("relationships").Add(float64(removed.RelationshipTotal()))
	r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, lethev1.ReasonResurrected, "Prune",
		"%d graph node(s) and %d relationship(s) of sessions erased by requests whose object is gone were written after the erasure and pruned (%d session(s) checked)",
		removed.NodeTotal(), removed.RelationshipTotal(), sessions)
	return nil
}
