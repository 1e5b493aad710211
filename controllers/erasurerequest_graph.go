package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/metrics"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// graph prunes what the knowledge graph derived from the erased sessions,
// in batches of sessions, each with its receipt in Postgres so that a
// restarted manager skips the batches done. It verifies by counting.
func (r *ErasureRequestReconciler) graph(ctx context.Context, s *scope) (bool, error) {
	er := s.req
	if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionGraphReconciled) {
		return true, nil
	}
	if s.store.Spec.FalkorDB == nil {
		return r.notConfigured(s, lethev1.ConditionGraphReconciled, "no FalkorDB graph is configured for this store")
	}
	g, f := r.graphOf(ctx, s.store)
	if f != nil {
		r.setStep(s, lethev1.ConditionGraphReconciled, false, lethev1.ReasonGraphUnavailable, "the graph cannot be reached: "+f.message)
		s.result = ctrl.Result{RequeueAfter: r.RetryAfter}
		return false, nil
	}
	uid := string(er.UID)
	ids, err := s.eraser.ErasedSessions(ctx, uid)
	if err != nil {
		r.setStep(s, lethev1.ConditionGraphReconciled, false, lethev1.ReasonDatabaseUnavailable, "the erasure ledger could not be read: "+err.Error())
		return false, err
	}
	receipts, err := s.eraser.Receipts(ctx, uid, postgres.StepGraph)
	if err != nil {
		r.setStep(s, lethev1.ConditionGraphReconciled, false, lethev1.ReasonDatabaseUnavailable, "the graph receipts could not be read: "+err.Error())
		return false, err
	}
	gctx, cancel := context.WithTimeout(ctx, r.GraphTimeout)
	defer cancel()
	r.setStep(s, lethev1.ConditionGraphReconciled, false, lethev1.ReasonGraphPruning, "pruning the graph elements of the erased sessions in bounded batches")
	batch := 0
	for chunk := range slices.Chunk(ids, r.GraphBatch) {
		b := batch
		batch++
		if _, done := receipts[b]; done {
			continue
		}
		removed, err := g.Prune(gctx, chunk, r.GraphDeleteLimit)
		if err != nil {
			return false, r.graphDown(s, err)
		}
		if r.crashAt(s, "between-graph-batches") {
			return false, nil
		}
		counts := graphCounts(removed)
		d, err := evidence.Digest(counts)
		if err != nil {
			return false, err
		}
		if err := s.eraser.WriteReceipt(ctx, uid, postgres.StepGraph, b, len(chunk), counts, d); err != nil {
			return false, err
		}
		metrics.GraphPruned.WithLabelValues("nodes").Add(float64(sum(removed.Nodes)))
		metrics.GraphPruned.WithLabelValues("relationships").Add(float64(sum(removed.Relationships)))
		receipts[b] = postgres.StepReceipt{Batch: b, Sessions: len(chunk), Counts: countMap(counts)}
	}

	left, err := g.Count(gctx, ids)
	if err != nil {
		return false, r.graphDown(s, err)
	}
	if left.Total() > 0 {
		// Written after a batch was pruned (a deriver still running): the
		// receipts are in, so prune every batch again, and record it.
		again, err := pruneAll(gctx, g, ids, r.GraphBatch, r.GraphDeleteLimit)
		if err != nil {
			return false, r.graphDown(s, err)
		}
		counts := graphCounts(again)
		d, err := evidence.Digest(counts)
		if err != nil {
			return false, err
		}
		if err := s.eraser.WriteReceipt(ctx, uid, postgres.StepGraph, batch+len(receipts), len(ids), counts, d); err != nil {
			return false, err
		}
		receipts[batch+len(receipts)] = postgres.StepReceipt{Sessions: len(ids), Counts: countMap(counts)}
		if left, err = g.Count(gctx, ids); err != nil {
			return false, r.graphDown(s, err)
		}
	}
	ev := lethev1.StepEvidence{Step: lethev1.ConditionGraphReconciled, CompletedAt: mtime(r.Clock.Now()), Counts: receiptCounts(receipts)}
	var remaining []string
	for _, kc := range left.Keys() {
		ev.Verification = append(ev.Verification, lethev1.Verification{Check: kc.Key + " with provenance in the erased sessions", Found: kc.Count})
		if kc.Count > 0 {
			remaining = append(remaining, kc.Key)
		}
	}
	ev.Note = fmt.Sprintf("%d erased session(s) pruned from graph %s in %d batch(es) of at most %d sessions, at most %d elements per query",
		len(ids), g.Name(), batch, r.GraphBatch, r.GraphDeleteLimit)
	setEvidence(&er.Status, ev)
	if len(remaining) > 0 {
		r.setStep(s, lethev1.ConditionGraphReconciled, false, lethev1.ReasonVerificationFailed,
			"graph elements of the erased sessions remain: "+strings.Join(remaining, ", ")+"; Lethe prunes again")
		s.result = ctrl.Result{RequeueAfter: r.RetryAfter}
		return false, nil
	}
	r.setStep(s, lethev1.ConditionGraphReconciled, true, lethev1.ReasonGraphPruned,
		"every graph element derived only from the erased sessions is removed and verified absent")
	r.milestone(s, lethev1.PhaseGraphReconciled, "", r.Clock.Now(), ev, ev.Note)
	return true, nil
}

// graphDown reports an unreachable or failing FalkorDB on the condition.
func (r *ErasureRequestReconciler) graphDown(s *scope, err error) error {
	msg := "FalkorDB did not complete the prune; Lethe retries: " + err.Error()
	if errors.Is(err, context.DeadlineExceeded) {
		msg = "FalkorDB did not answer in time; Lethe retries"
	}
	r.setStep(s, lethev1.ConditionGraphReconciled, false, lethev1.ReasonGraphUnavailable, msg)
	return err
}

// reverifyGraph prunes again graph elements of the erased sessions written
// after the step (a deriver working from a stale source) and records it.
func (r *ErasureRequestReconciler) reverifyGraph(ctx context.Context, s *scope) error {
	if s.store.Spec.FalkorDB == nil {
		return nil
	}
	if c := meta.FindStatusCondition(s.req.Status.Conditions, lethev1.ConditionGraphReconciled); c == nil || c.Reason != lethev1.ReasonGraphPruned {
		return nil
	}
	g, f := r.graphOf(ctx, s.store)
	if f != nil {
		return errors.New(f.message)
	}
	ids, err := s.eraser.ErasedSessions(ctx, string(s.req.UID))
	if err != nil {
		return err
	}
	gctx, cancel := context.WithTimeout(ctx, r.GraphTimeout)
	defer cancel()
	left, err := g.Count(gctx, ids)
	if err != nil || left.Total() == 0 {
		return err
	}
	removed, err := pruneAll(gctx, g, ids, r.GraphBatch, r.GraphDeleteLimit)
	if err != nil {
		return err
	}
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: mtime(r.Clock.Now()), Counts: toCounts(graphCounts(removed)),
		Note: fmt.Sprintf("%d graph element(s) of erased sessions reappeared in graph %s and were pruned again", removed.Total(), g.Name())}
	setEvidence(&s.req.Status, ev)
	r.Recorder.Eventf(s.req, nil, corev1.EventTypeWarning, lethev1.ReasonResurrected, "Prune", "%d graph element(s) of erased sessions reappeared and were pruned again", removed.Total())
	r.milestone(s, s.req.Status.Phase, lethev1.ReasonResurrected, r.Clock.Now(), ev, ev.Note)
	return nil
}

// graphOf returns the store's graph.
func (r *ErasureRequestReconciler) graphOf(ctx context.Context, store *lethev1.MemoryStore) (*graph.Graph, *failure) {
	return storeGraph(ctx, r.SecretReader, r.Graphs, store)
}

func pruneAll(ctx context.Context, g *graph.Graph, ids []string, batch, limit int) (graph.Counts, error) {
	var removed graph.Counts
	for chunk := range slices.Chunk(ids, batch) {
		n, err := g.Prune(ctx, chunk, limit)
		if err != nil {
			return removed, err
		}
		removed.Add(n)
	}
	return removed, nil
}

func graphCounts(c graph.Counts) []postgres.Count {
	var out []postgres.Count
	for _, kc := range c.Keys() {
		out = append(out, postgres.Count{Table: kc.Key, Rows: kc.Count})
	}
	return out
}

func countMap(cs []postgres.Count) map[string]int64 {
	m := map[string]int64{}
	for _, c := range cs {
		m[c.Table] += c.Rows
	}
	return m
}

// receiptCounts sums the receipts' counts, sorted by key.
func receiptCounts(receipts map[int]postgres.StepReceipt) []lethev1.TableCount {
	total := map[string]int64{}
	for _, rc := range receipts {
		for k, v := range rc.Counts {
			total[k] += v
		}
	}
	var out []lethev1.TableCount
	for _, k := range slices.Sorted(maps.Keys(total)) {
		out = append(out, lethev1.TableCount{Table: k, Rows: total[k]})
	}
	return out
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
