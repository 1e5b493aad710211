package erasure

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// GraphPrune is step 4: it prunes what the knowledge graph derived from
// the erased sessions, in batches of sessions, each with its receipt in the
// ledger so that a restarted manager skips the batches done, and verifies
// by counting.
type GraphPrune struct{ Config Config }

// Name is the step's condition type.
func (GraphPrune) Name() string { return lethev1.ConditionGraphReconciled }

func (g GraphPrune) Run(ctx context.Context, s *Scope) Outcome {
	if s.isTrue(lethev1.ConditionGraphReconciled) {
		return Outcome{Kind: Done}
	}
	if s.Graph == nil {
		return notConfigured(s, lethev1.ConditionGraphReconciled, "no FalkorDB graph is configured for this store")
	}
	ids, receipts, err := g.ledger(ctx, s)
	if err != nil {
		return failed(g.Config, lethev1.ConditionGraphReconciled, lethev1.ReasonDatabaseUnavailable,
			"the erasure ledger could not be read; Lethe retries", err)
	}
	gctx, cancel := context.WithTimeout(ctx, g.Config.GraphTimeout)
	defer cancel()
	var work Work
	// The graph's calls are bounded by gctx; the ledger's receipts are not,
	// so a time bound reached after a prune still records it.
	batches, err := g.pruneBatches(ctx, gctx, s, ids, receipts, &work)
	if err != nil {
		return g.down(err, work)
	}
	left, err := s.Graph.Count(gctx, ids)
	if err == nil && left.Total() > 0 {
		// Written after a batch was pruned (a deriver still running): the
		// receipts are in, so prune every batch again, and record it.
		left, err = g.pruneAgain(ctx, gctx, s, ids, receipts, &work)
	}
	if err != nil {
		return g.down(err, work)
	}
	ev := lethev1.StepEvidence{Step: lethev1.ConditionGraphReconciled, CompletedAt: mtime(s.Clock.Now()), Counts: receiptCounts(receipts)}
	var remaining []string
	for _, kc := range left.Keys() {
		ev.Verification = append(ev.Verification, lethev1.Verification{Check: kc.Key + " with provenance in the erased sessions", Found: kc.Count})
		if kc.Count > 0 {
			remaining = append(remaining, kc.Key)
		}
	}
	ev.Note = fmt.Sprintf("%d erased session(s) pruned from graph %s in %d batch(es) of at most %d sessions, at most %d elements per query",
		len(ids), s.Graph.Name(), batches, g.Config.GraphBatch, g.Config.GraphDeleteLimit)
	if len(remaining) > 0 {
		out := stalled(g.Config.RetryAfter, lethev1.ConditionGraphReconciled, lethev1.ReasonVerificationFailed,
			"graph elements of the erased sessions remain: "+strings.Join(remaining, ", ")+"; Lethe prunes again")
		out.Evidence, out.Work = &ev, work
		return out
	}
	out := done(lethev1.ConditionGraphReconciled, lethev1.ReasonGraphPruned,
		"every graph element derived only from the erased sessions is removed and verified absent")
	out.Evidence, out.Work = &ev, work
	out.Milestone = &Milestone{Phase: lethev1.PhaseGraphReconciled, At: s.Clock.Now(), Evidence: ev, Note: ev.Note}
	return out
}

// ledger reads the sessions the request erased and the graph receipts.
func (g GraphPrune) ledger(ctx context.Context, s *Scope) ([]string, map[int]StepReceipt, error) {
	ids, err := s.Ledger.ErasedSessions(ctx, s.uid())
	if err != nil {
		return nil, nil, err
	}
	receipts, err := s.Ledger.Receipts(ctx, s.uid(), StepGraph)
	if receipts == nil {
		receipts = map[int]StepReceipt{}
	}
	return ids, receipts, err
}

// pruneBatches prunes each batch of sessions without a receipt and writes
// its receipt; it returns the number of batches.
func (g GraphPrune) pruneBatches(ctx, gctx context.Context, s *Scope, ids []string, receipts map[int]StepReceipt, work *Work) (int, error) {
	batch := 0
	for chunk := range slices.Chunk(ids, g.Config.GraphBatch) {
		b := batch
		batch++
		if _, done := receipts[b]; done {
			continue
		}
		removed, err := s.Graph.Prune(gctx, chunk, g.Config.GraphDeleteLimit)
		if err != nil {
			return batch, err
		}
		work.GraphPruned.Add(removed)
		counts := graphCounts(removed)
		if err := s.Ledger.WriteReceipt(ctx, s.uid(), StepGraph, b, len(chunk), counts); err != nil {
			return batch, ledgerError{err}
		}
		receipts[b] = StepReceipt{Batch: b, Sessions: len(chunk), Counts: countMap(counts)}
	}
	return batch, nil
}

// pruneAgain prunes every batch again, records it under a receipt of its
// own and counts what is left.
func (g GraphPrune) pruneAgain(ctx, gctx context.Context, s *Scope, ids []string, receipts map[int]StepReceipt, work *Work) (GraphCounts, error) {
	again, err := pruneAll(gctx, s.Graph, ids, g.Config.GraphBatch, g.Config.GraphDeleteLimit)
	if err != nil {
		return GraphCounts{}, err
	}
	work.GraphPruned.Add(again)
	counts := graphCounts(again)
	if err := s.Ledger.AppendReceipt(ctx, s.uid(), StepGraph, len(ids), counts); err != nil {
		return GraphCounts{}, ledgerError{err}
	}
	receipts[-len(receipts)-1] = StepReceipt{Sessions: len(ids), Counts: countMap(counts)}
	return s.Graph.Count(gctx, ids)
}

// down reports a graph (or ledger) error: the pass's time bound reached
// after some batches were pruned is progress, not an outage.
func (g GraphPrune) down(err error, work Work) Outcome {
	var out Outcome
	switch {
	case errors.As(err, new(ledgerError)):
		out = failed(g.Config, lethev1.ConditionGraphReconciled, lethev1.ReasonDatabaseUnavailable,
			"a graph receipt could not be written; Lethe prunes the batch again and retries", err)
	case errors.Is(err, context.DeadlineExceeded) && work.GraphPruned.Total() > 0:
		out = waiting(time.Second, lethev1.ConditionGraphReconciled, lethev1.ReasonGraphPruning,
			"pruning the graph elements of the erased sessions in bounded batches; the receipts record the batches done")
	case errors.Is(err, context.DeadlineExceeded):
		out = failed(g.Config, lethev1.ConditionGraphReconciled, lethev1.ReasonGraphUnavailable, "FalkorDB did not answer in time; Lethe retries", err)
	default:
		out = failed(g.Config, lethev1.ConditionGraphReconciled, lethev1.ReasonGraphUnavailable, "FalkorDB did not complete the prune; Lethe retries", err)
	}
	out.Work = work
	return out
}

// Reverify prunes again graph elements of the erased sessions written after
// the step (a deriver working from a stale source) and records it.
func (g GraphPrune) Reverify(ctx context.Context, s *Scope) Outcome {
	if s.Graph == nil || s.reason(lethev1.ConditionGraphReconciled) != lethev1.ReasonGraphPruned {
		return Outcome{Kind: Done}
	}
	ids, err := s.Ledger.ErasedSessions(ctx, s.uid())
	if err != nil {
		return errored(err)
	}
	gctx, cancel := context.WithTimeout(ctx, g.Config.GraphTimeout)
	defer cancel()
	left, err := s.Graph.Count(gctx, ids)
	if err != nil || left.Total() == 0 {
		return Outcome{Kind: kindOf(err), Err: err}
	}
	removed, err := pruneAll(gctx, s.Graph, ids, g.Config.GraphBatch, g.Config.GraphDeleteLimit)
	if err != nil {
		return errored(err)
	}
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: mtime(s.Clock.Now()), Counts: tableCounts(graphCounts(removed)),
		Note: fmt.Sprintf("%d graph element(s) of erased sessions reappeared in graph %s and were pruned again", removed.Total(), s.Graph.Name())}
	return Outcome{Kind: Done, Evidence: &ev, Work: Work{GraphPruned: removed},
		Milestone: &Milestone{Phase: s.Request.Status.Phase, Event: lethev1.ReasonResurrected, At: s.Clock.Now(), Evidence: ev, Note: ev.Note},
		Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Prune",
			Note: fmt.Sprintf("%d graph element(s) of erased sessions reappeared and were pruned again", removed.Total())},
	}
}

// ledgerError marks a ledger failure inside the graph work.
type ledgerError struct{ error }

func (e ledgerError) Unwrap() error { return e.error }

func kindOf(err error) Kind {
	if err != nil {
		return Errored
	}
	return Done
}

// notConfigured completes a step the store has no section for.
func notConfigured(s *Scope, condType, msg string) Outcome {
	out := done(condType, lethev1.ReasonNotConfigured, msg)
	out.Milestone = &Milestone{Phase: milestoneOf[condType], Event: lethev1.ReasonNotConfigured, At: s.Clock.Now(),
		Evidence: map[string]string{"step": condType, "reason": lethev1.ReasonNotConfigured}, Note: condType + ": not configured"}
	return out
}

func pruneAll(ctx context.Context, g Graph, ids []string, batch, limit int) (GraphCounts, error) {
	var removed GraphCounts
	for chunk := range slices.Chunk(ids, batch) {
		n, err := g.Prune(ctx, chunk, limit)
		if err != nil {
			return removed, err
		}
		removed.Add(n)
	}
	return removed, nil
}

func graphCounts(c GraphCounts) []Count {
	var out []Count
	for _, kc := range c.Keys() {
		out = append(out, Count{Table: kc.Key, Rows: kc.Count})
	}
	return out
}

func countMap(cs []Count) map[string]int64 {
	m := map[string]int64{}
	for _, c := range cs {
		m[c.Table] += c.Rows
	}
	return m
}

// receiptCounts sums the receipts' counts, sorted by key.
func receiptCounts(receipts map[int]StepReceipt) []lethev1.TableCount {
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
