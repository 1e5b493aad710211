package erasure

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func runGraphPrune(ctx context.Context, s *Scope) Outcome {
	return GraphPrune{Config: testConfig}.Run(ctx, s)
}

func reverifyGraph(ctx context.Context, s *Scope) Outcome {
	return GraphPrune{Config: testConfig}.Reverify(ctx, s)
}

// The request erased five sessions; with GraphBatch 2 they are three
// batches, [s1 s2] [s3 s4] [s5], and batch 1 has its receipt from an
// earlier pass.
var erased = []string{"s1", "s2", "s3", "s4", "s5"}

const (
	erasedCall   = "Ledger.ErasedSessions(req-uid)"
	receiptsCall = "Ledger.Receipts(req-uid, GraphReconciled)"
	countCall    = "Graph.Count([s1 s2 s3 s4 s5])"
	nameCall     = "Graph.Name()"
)

func nodes(label string, n int64) GraphCounts {
	return GraphCounts{Nodes: map[string]int64{label: n}}
}

// pruned is what the first prune of batches 0 and 2 removes.
var (
	batch0 = GraphCounts{Nodes: map[string]int64{"Fact": 3}, Relationships: map[string]int64{"MENTIONS": 4}}
	batch2 = nodes("Fact", 1)
)

// result is one answer of a graph fake.
type result struct {
	c   GraphCounts
	err error
}

// answers returns its results in turn, one a call.
func answers(rs ...result) func() (GraphCounts, error) {
	var mu sync.Mutex
	return func() (GraphCounts, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(rs) == 0 {
			return GraphCounts{}, errors.New("test: no answer left")
		}
		r := rs[0]
		rs = rs[1:]
		return r.c, r.err
	}
}

func pruneAnswers(rs ...result) func(context.Context, []string, int) (GraphCounts, error) {
	next := answers(rs...)
	return func(context.Context, []string, int) (GraphCounts, error) { return next() }
}

func countAnswers(rs ...result) func(context.Context, []string) (GraphCounts, error) {
	next := answers(rs...)
	return func(context.Context, []string) (GraphCounts, error) { return next() }
}

var cleanCount = result{c: GraphCounts{Nodes: map[string]int64{"Fact": 0}, Relationships: map[string]int64{"MENTIONS": 0}}}

// graphFakes prunes batches 0 and 2 and counts nothing left; mods change it.
func graphFakes(mods ...func(*fakes)) fakes {
	f := fakes{
		ledger: LedgerFns{
			ErasedSessionsFn: func(context.Context, string) ([]string, error) { return erased, nil },
			ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) {
				return map[int]StepReceipt{1: {Batch: 1, Sessions: 2, Counts: map[string]int64{"graph nodes :Fact": 2}}}, nil
			},
			WriteReceiptFn: func(context.Context, string, string, int, int, []Count) error { return nil },
		},
		graph: &GraphFns{NameFn: func() string { return "memory" },
			PruneFn: pruneAnswers(result{c: batch0}, result{c: batch2}), CountFn: countAnswers(cleanCount)},
	}
	for _, m := range mods {
		m(&f)
	}
	return f
}

const (
	prune0   = "Graph.Prune([s1 s2], 100)"
	prune1   = "Graph.Prune([s3 s4], 100)"
	prune2   = "Graph.Prune([s5], 100)"
	receipt0 = "Ledger.WriteReceipt(req-uid, GraphReconciled, 0, 2, [{graph nodes :Fact 3} {graph relationships :MENTIONS 4}])"
	receipt2 = "Ledger.WriteReceipt(req-uid, GraphReconciled, 2, 1, [{graph nodes :Fact 1}])"
)

// prunedEvidence is the step's evidence: the receipts' counts summed and
// what the last count found.
func prunedEvidence(facts int64, left ...lethev1.Verification) lethev1.StepEvidence {
	return lethev1.StepEvidence{Step: lethev1.ConditionGraphReconciled, CompletedAt: secs(now),
		Counts:       []lethev1.TableCount{{Table: "graph nodes :Fact", Rows: facts}, {Table: "graph relationships :MENTIONS", Rows: 4}},
		Verification: left,
		Note:         "5 erased session(s) pruned from graph memory in 3 batch(es) of at most 2 sessions, at most 100 elements per query"}
}

func leftOver(facts int64) []lethev1.Verification {
	return []lethev1.Verification{{Check: "graph nodes :Fact with provenance in the erased sessions", Found: facts},
		{Check: "graph relationships :MENTIONS with provenance in the erased sessions", Found: 0}}
}

var prunedCond = &Condition{Type: lethev1.ConditionGraphReconciled, OK: true, Reason: lethev1.ReasonGraphPruned,
	Message: "every graph element derived only from the erased sessions is removed and verified absent"}

func graphPruned(ev lethev1.StepEvidence, work GraphCounts) Outcome {
	return Outcome{Kind: Done, Condition: prunedCond, Evidence: &ev, Work: Work{GraphPruned: work},
		Milestone: &Milestone{Phase: lethev1.PhaseGraphReconciled, At: now, Evidence: ev, Note: ev.Note}}
}

// leftAfterPrune counts a Fact left after the first prune, prunes it
// again, and counts last after that.
func leftAfterPrune(last result) func(*fakes) {
	return func(f *fakes) {
		f.graph.PruneFn = pruneAnswers(result{c: batch0}, result{c: batch2}, result{}, result{c: nodes("Fact", 1)}, result{})
		f.graph.CountFn = countAnswers(result{c: nodes("Fact", 1)}, last)
		f.ledger.AppendReceiptFn = func(context.Context, string, string, int, []Count) error { return nil }
	}
}

// oneFactLeft is a count that still finds a Fact.
var oneFactLeft = result{c: GraphCounts{Nodes: map[string]int64{"Fact": 1}, Relationships: map[string]int64{"MENTIONS": 0}}}

func TestGraphPruneRun(t *testing.T) {
	notConfigured := &Condition{Type: lethev1.ConditionGraphReconciled, OK: true, Reason: lethev1.ReasonNotConfigured,
		Message: "no FalkorDB graph is configured for this store"}
	done := graphPruned(prunedEvidence(6, leftOver(0)...), GraphCounts{Nodes: map[string]int64{"Fact": 4}, Relationships: map[string]int64{"MENTIONS": 4}})
	again := graphPruned(prunedEvidence(7, leftOver(0)...), GraphCounts{Nodes: map[string]int64{"Fact": 5}, Relationships: map[string]int64{"MENTIONS": 4}})
	remainEv := prunedEvidence(7, leftOver(1)...)
	remainCond := &Condition{Type: lethev1.ConditionGraphReconciled, Reason: lethev1.ReasonVerificationFailed,
		Message: "graph elements of the erased sessions remain: graph nodes :Fact; Lethe prunes again"}
	firstPass := []string{erasedCall, receiptsCall, prune0, receipt0, prune2, receipt2, countCall}
	prunedAgain := append(firstPass[:len(firstPass):len(firstPass)], prune0, prune1, prune2,
		"Ledger.AppendReceipt(req-uid, GraphReconciled, 5, [{graph nodes :Fact 1}])", countCall, nameCall)
	runCases(t, runGraphPrune, map[string]stepCase{
		"AlreadyReconciled": {reason: "A True condition is done without calling any port.",
			er: reached(4), store: newStore(withGraph), fakes: fakes{graph: &GraphFns{}}, want: stepWant{out: Outcome{Kind: Done}, status: after(reached(4))}},
		"NotConfigured": {reason: "A store without a graph completes the step at once, and the history says it was not configured.",
			er: atGraph(),
			want: stepWant{out: Outcome{Kind: Done, Condition: notConfigured, Milestone: &Milestone{Phase: lethev1.PhaseGraphReconciled,
				Event: lethev1.ReasonNotConfigured, At: now, Evidence: map[string]string{"step": lethev1.ConditionGraphReconciled, "reason": lethev1.ReasonNotConfigured},
				Note: "GraphReconciled: not configured"}},
				status: after(atGraph(), withCond(notConfigured), withEntry(lethev1.PhaseGraphReconciled, lethev1.ReasonNotConfigured, now))}},
		"SkipsBatchesWithReceipts": {reason: "Batch 1 has its receipt: it is not pruned again; batches 0 and 2 are, each with its receipt under its own key.",
			er: atGraph(), store: newStore(withGraph), fakes: graphFakes(),
			want: stepWant{out: done, calls: append(firstPass[:len(firstPass):len(firstPass)], nameCall),
				status: after(atGraph(), withCond(prunedCond), withEvidence(*done.Evidence), withEntry(lethev1.PhaseGraphReconciled, "", now))}},
		"LeftoverPrunedAgain": {reason: "Elements written after their batch was pruned: every batch is pruned again and recorded under one more receipt.",
			er: atGraph(), store: newStore(withGraph), fakes: graphFakes(leftAfterPrune(cleanCount)),
			want: stepWant{out: again, calls: prunedAgain,
				status: after(atGraph(), withCond(prunedCond), withEvidence(*again.Evidence), withEntry(lethev1.PhaseGraphReconciled, "", now))}},
		"RemainingAfterPruneAgain": {reason: "Elements still there after pruning again need a human: stalled, with what remains.",
			er: atGraph(), store: newStore(withGraph), fakes: graphFakes(leftAfterPrune(oneFactLeft)),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: remainCond, Evidence: &remainEv, RequeueAfter: testConfig.RetryAfter,
				Work: again.Work}, calls: prunedAgain, status: after(atGraph(), withCond(remainCond), withEvidence(remainEv))}},
	})
}

func TestGraphPruneErrors(t *testing.T) {
	cond := func(reason, msg string) *Condition {
		return &Condition{Type: lethev1.ConditionGraphReconciled, Reason: reason, Message: msg}
	}
	graphDown := cond(lethev1.ReasonGraphUnavailable, "FalkorDB did not complete the prune; Lethe retries")
	noAnswer := cond(lethev1.ReasonGraphUnavailable, "FalkorDB did not answer in time; Lethe retries")
	pruning := cond(lethev1.ReasonGraphPruning, "pruning the graph elements of the erased sessions in bounded batches; the receipts record the batches done")
	receiptFailed := cond(lethev1.ReasonDatabaseUnavailable, "a graph receipt could not be written; Lethe prunes the batch again and retries")
	ledgerDown := cond(lethev1.ReasonDatabaseUnavailable, "the erasure ledger could not be read; Lethe retries")
	configCond := cond(errConfig.Reason, errConfig.Message)
	deadline := fmt.Errorf("falkordb: %w", context.DeadlineExceeded)
	prunes := func(rs ...result) func(*fakes) { return func(f *fakes) { f.graph.PruneFn = pruneAnswers(rs...) } }
	ledgerFails := func(f *fakes) {
		f.ledger.ErasedSessionsFn = func(context.Context, string) ([]string, error) { return nil, errPort }
	}
	receiptsConfig := func(f *fakes) {
		f.ledger.ReceiptsFn = func(context.Context, string, string) (map[int]StepReceipt, error) { return nil, errConfig }
	}
	writeFails := func(f *fakes) {
		f.ledger.WriteReceiptFn = func(context.Context, string, string, int, int, []Count) error { return errPort }
	}
	withWork := func(o Outcome, w GraphCounts) Outcome { o.Work = Work{GraphPruned: w}; return o }
	store, base := newStore(withGraph), atGraph()
	runCases(t, runGraphPrune, map[string]stepCase{
		"GraphDown": {reason: "A prune that failed is an error with GraphUnavailable; no receipt is written for it.",
			er: base, store: store, fakes: graphFakes(prunes(result{err: errPort})),
			want: stepWant{out: Outcome{Kind: Errored, Condition: graphDown}, err: errPort, status: after(base, withCond(graphDown)),
				calls: []string{erasedCall, receiptsCall, prune0}}},
		"GraphConfigError": {reason: "A graph whose Secret is missing waits with the ConfigError's reason and message.",
			er: base, store: store, fakes: graphFakes(prunes(result{err: errConfig})),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: configCond, RequeueAfter: testConfig.RetryAfter}, status: after(base, withCond(configCond)),
				calls: []string{erasedCall, receiptsCall, prune0}}},
		"DeadlineAfterSomeBatches": {reason: "The pass's time bound reached after a batch was pruned is progress: wait a second, not an error.",
			er: base, store: store, fakes: graphFakes(prunes(result{c: batch0}, result{err: deadline})),
			want: stepWant{out: withWork(Outcome{Kind: Waiting, Condition: pruning, RequeueAfter: time.Second}, batch0), status: after(base, withCond(pruning)),
				calls: []string{erasedCall, receiptsCall, prune0, receipt0, prune2}}},
		"DeadlineBeforeAnyBatch": {reason: "The time bound reached before anything was pruned is a graph that does not answer.",
			er: base, store: store, fakes: graphFakes(prunes(result{err: deadline})),
			want: stepWant{out: Outcome{Kind: Errored, Condition: noAnswer}, err: context.DeadlineExceeded, status: after(base, withCond(noAnswer)),
				calls: []string{erasedCall, receiptsCall, prune0}}},
		"ReceiptWriteError": {reason: "A receipt that could not be written is the database's error, not the graph's; the pruned work still counts.",
			er: base, store: store, fakes: graphFakes(writeFails),
			want: stepWant{out: withWork(Outcome{Kind: Errored, Condition: receiptFailed}, batch0), err: errPort, status: after(base, withCond(receiptFailed)),
				calls: []string{erasedCall, receiptsCall, prune0, receipt0}}},
		"CountError": {reason: "A verification count that failed is an error with GraphUnavailable, never a success.",
			er: base, store: store, fakes: graphFakes(func(f *fakes) { f.graph.CountFn = countAnswers(result{err: errPort}) }),
			want: stepWant{out: withWork(Outcome{Kind: Errored, Condition: graphDown}, GraphCounts{Nodes: map[string]int64{"Fact": 4}, Relationships: map[string]int64{"MENTIONS": 4}}),
				err: errPort, status: after(base, withCond(graphDown)), calls: []string{erasedCall, receiptsCall, prune0, receipt0, prune2, receipt2, countCall}}},
		"LedgerError": {reason: "The erased sessions that cannot be read are the database's error; the graph is not touched.",
			er: base, store: store, fakes: graphFakes(ledgerFails),
			want: stepWant{out: Outcome{Kind: Errored, Condition: ledgerDown}, err: errPort, status: after(base, withCond(ledgerDown)), calls: []string{erasedCall}}},
		"LedgerConfigError": {reason: "A ledger blocked by the configuration waits with the ConfigError's reason and message.",
			er: base, store: store, fakes: graphFakes(receiptsConfig),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: configCond, RequeueAfter: testConfig.RetryAfter}, status: after(base, withCond(configCond)),
				calls: []string{erasedCall, receiptsCall}}},
	})
}

func TestGraphPruneReverify(t *testing.T) {
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: secs(now), Counts: []lethev1.TableCount{{Table: "graph nodes :Fact", Rows: 2}},
		Note: "2 graph element(s) of erased sessions reappeared in graph memory and were pruned again"}
	back := func(f *fakes) {
		f.graph.CountFn = countAnswers(result{c: nodes("Fact", 2)})
		f.graph.PruneFn = pruneAnswers(result{c: nodes("Fact", 2)}, result{}, result{})
	}
	failing := func(count, prune error) func(*fakes) {
		return func(f *fakes) {
			f.graph.CountFn = countAnswers(result{c: nodes("Fact", 2), err: count})
			f.graph.PruneFn = pruneAnswers(result{err: prune})
		}
	}
	store := newStore(withGraph)
	notConfigured := reached(5, withStatusCondition(lethev1.ConditionGraphReconciled, true, lethev1.ReasonNotConfigured))
	runCases(t, reverifyGraph, map[string]stepCase{
		"NoGraph": {reason: "A store without a graph has nothing to check.",
			er: completed(), want: stepWant{out: Outcome{Kind: Done}, status: after(completed())}},
		"NotPrunedByTheStep": {reason: "A step completed as NotConfigured (the graph added later) is not re-verified: no port is called.",
			er: notConfigured, store: store, fakes: fakes{graph: &GraphFns{}}, want: stepWant{out: Outcome{Kind: Done}, status: after(notConfigured)}},
		"Clean": {reason: "Nothing of the erased sessions in the graph: done, nothing recorded.",
			er: completed(), store: store, fakes: graphFakes(),
			want: stepWant{out: Outcome{Kind: Done}, status: after(completed()), calls: []string{erasedCall, countCall}}},
		"Reappeared": {reason: "Elements written after the step (a stale deriver) are pruned again: a Resurrected milestone and a Warning; the condition stays.",
			er: completed(), store: store, fakes: graphFakes(back),
			want: stepWant{out: Outcome{Kind: Done, Evidence: &ev, Work: Work{GraphPruned: nodes("Fact", 2)},
				Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, Event: lethev1.ReasonResurrected, At: now, Evidence: ev, Note: ev.Note},
				Warning:   &Warning{Reason: lethev1.ReasonResurrected, Action: "Prune", Note: "2 graph element(s) of erased sessions reappeared and were pruned again"}},
				status: after(completed(), withEvidence(ev), withEntry(lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, now)),
				calls:  []string{erasedCall, countCall, prune0, prune1, prune2, nameCall}}},
		"CountError": {reason: "A count that failed is an error for a retry; no condition changes.",
			er: completed(), store: store, fakes: graphFakes(failing(errPort, nil)),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(completed()), calls: []string{erasedCall, countCall}}},
		"PruneError": {reason: "A prune that failed is an error for a retry.",
			er: completed(), store: store, fakes: graphFakes(failing(nil, errPort)),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(completed()), calls: []string{erasedCall, countCall, prune0}}},
		"LedgerError": {reason: "Erased sessions that cannot be read are an error; the graph is not asked.",
			er: completed(), store: store, fakes: graphFakes(func(f *fakes) {
				f.ledger.ErasedSessionsFn = func(context.Context, string) ([]string, error) { return nil, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(completed()), calls: []string{erasedCall}}},
	})
}
