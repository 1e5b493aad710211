package erasure

import (
	"context"
	"fmt"
	"maps"
	"slices"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Reverify erases again, at once, any session the request found and erased
// that exists again, and puts back the ledger rows a restore of the database
// took away (the ledger lives in that database: it rolls back with it), then
// records the resurrection in the history once every replica replayed it.
// What was found comes from the request (kept by the API server), not from
// the ledger.
//
// The Deleted condition stays True while the replicas catch up (the step is
// done; the phase does not go back): the wait shows as one Warning, and the
// Resurrected entry follows from the receipt (lostEntry) on the pass that
// finds them caught up, as the grace period's does.
func (d *Deletion) Reverify(ctx context.Context, s *Scope) Outcome {
	req := FoundRequest(s.Request)
	if len(req.SessionIDs) == 0 {
		return Outcome{Kind: Done}
	}
	res, err := s.Ledger.Reerase(ctx, req)
	if err != nil {
		return errored(err)
	}
	if !reerasedAnything(res) {
		return d.lostEntry(ctx, s)
	}
	if out, behind := d.replicasBehind(ctx, s, res.CommitLSN, res.Batch); behind {
		return out
	}
	return resurrected(s, res)
}

// replicasBehind is the outcome of a re-erasure (its Resurrected receipt
// batch, committed before the WAL position lsn) that a replica has not
// replayed yet: a Waiting outcome without a condition, its Warning on the
// first pass that waits for this receipt only.
func (d *Deletion) replicasBehind(ctx context.Context, s *Scope, lsn string, batch int) (Outcome, bool) {
	of := fmt.Sprintf("receipt %d", batch)
	first := !d.Waits.remembers(s.uid(), StepResurrected, of)
	caughtUp, err := d.Waits.caughtUp(ctx, s, StepResurrected, lsn, of)
	switch {
	case err != nil:
		return errored(fmt.Errorf("ask the replicas whether they replayed the re-erasure: %w", err)), true
	case caughtUp:
		return Outcome{}, false
	}
	out := Outcome{Kind: Waiting, RequeueAfter: d.Config.ReplicaRecheck}
	if first {
		out.Warning = &Warning{Reason: lethev1.ReasonReplicaLagging, Action: "Erase",
			Note: fmt.Sprintf("erased sessions came back and were erased again on the primary (Resurrected receipt %d); a replica has not replayed that yet: the Resurrected entry is recorded once every replica has", batch)}
	}
	return out, true
}

// reerasedAnything reports whether a re-erasure erased, put back or
// removed anything.
func reerasedAnything(r BatchResult) bool {
	return !r.Skipped && (r.Sessions > 0 || r.LedgerRowsRestored > 0 || r.DerivedRecords > 0 || r.ContentIndexEntries > 0)
}

// resurrected is the Done outcome of a re-erasure that did something: its
// evidence, its Resurrected history entry and a Warning.
func resurrected(s *Scope, res BatchResult) Outcome {
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: mtime(res.DeletedAt), Counts: tableCounts(res.Rows),
		Note: fmt.Sprintf("%d resurrected session(s) erased again; %d ledger row(s) found missing or not erased (a restored database) put back in force; residue removed: %d derived record(s), %d content-keyed entr(ies)",
			res.Sessions, res.LedgerRowsRestored, res.DerivedRecords, res.ContentIndexEntries)}
	ev.Counts = append(ev.Counts,
		lethev1.TableCount{Table: CountContentIndexEntries, Rows: res.ContentIndexEntries},
		lethev1.TableCount{Table: CountDerivedRecords, Rows: res.DerivedRecords},
		lethev1.TableCount{Table: "erasure ledger rows put back", Rows: res.LedgerRowsRestored})
	return Outcome{Kind: Done, Evidence: &ev,
		Milestone: &Milestone{Phase: s.Request.Status.Phase, Event: lethev1.ReasonResurrected, At: res.DeletedAt, Evidence: ev, Note: ev.Note},
		Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Erase",
			Note: fmt.Sprintf("%d erased session(s) reappeared and were erased again; %d ledger row(s) put back; %d residue record(s) removed",
				res.Sessions, res.LedgerRowsRestored, res.DerivedRecords+res.ContentIndexEntries)},
	}
}

// lostEntry records, from its receipt, a re-erasure whose history entry is
// not there: it waited for the replicas, or its transaction committed (with
// its receipt) and the status write that followed did not (a crash, a
// conflict). Each Resurrected receipt has a Resurrected history entry,
// however late.
//
// A receipt's entry is the one at its time (the re-erasure's entry carries
// the receipt transaction's clock reading; the history keeps seconds), not
// one of a count: the graph's and the Backups' re-checks record Resurrected
// entries without a receipt here, and a restore takes back the receipts of
// entries recorded after its dump, so counts say nothing of one receipt.
func (d *Deletion) lostEntry(ctx context.Context, s *Scope) Outcome {
	receipts, err := s.Ledger.Receipts(ctx, s.uid(), StepResurrected)
	if err != nil {
		return errored(err)
	}
	r, lost := unrecordedReceipt(receipts, s.Request.Status.History)
	if !lost {
		return Outcome{Kind: Done}
	}
	if out, behind := d.lostBehind(ctx, s, r.Batch); behind {
		return out
	}
	at := r.At
	if at.IsZero() {
		at = s.Clock.Now()
	}
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: mtime(at), Counts: oneReceiptCounts(r),
		Note: fmt.Sprintf("a re-erasure (Resurrected receipt %d, %d session(s)) recorded from its receipt: its entry waited for the replicas to replay it, or its status write was lost", r.Batch, r.Sessions)}
	return Outcome{Kind: Done, Evidence: &ev,
		Milestone: &Milestone{Phase: s.Request.Status.Phase, Event: lethev1.ReasonResurrected, At: at, Evidence: ev, Note: ev.Note}}
}

// unrecordedReceipt is the first Resurrected receipt, by batch, without a
// Resurrected entry at its time in history (two receipts of one second
// need two entries of that second). A receipt the ledger did not date is
// matched by count, as far as that goes: undated receipts beyond the
// number of Resurrected entries.
func unrecordedReceipt(receipts map[int]StepReceipt, history []lethev1.HistoryEntry) (StepReceipt, bool) {
	at := map[int64]int{}
	entries := 0
	for _, h := range history {
		if h.Event == lethev1.ReasonResurrected {
			at[h.Time.Unix()]++
			entries++
		}
	}
	undated := 0
	for _, b := range slices.Sorted(maps.Keys(receipts)) {
		r := receipts[b]
		if r.At.IsZero() {
			if undated++; undated > entries {
				return r, true
			}
			continue
		}
		if at[r.At.Unix()] == 0 {
			return r, true
		}
		at[r.At.Unix()]--
	}
	return StepReceipt{}, false
}

// oneReceiptCounts are a receipt's counts, sorted by table.
func oneReceiptCounts(r StepReceipt) []lethev1.TableCount {
	out := make([]lethev1.TableCount, 0, len(r.Counts))
	for _, k := range slices.Sorted(maps.Keys(r.Counts)) {
		out = append(out, lethev1.TableCount{Table: k, Rows: r.Counts[k]})
	}
	return out
}

// lostBehind is replicasBehind for a receipt whose re-erasure this process
// did not see commit (or whose position it forgot): the position waited
// for is the one remembered, else the primary's now, later than needed,
// which is safe.
func (d *Deletion) lostBehind(ctx context.Context, s *Scope, batch int) (Outcome, bool) {
	lsn := ""
	if !d.Waits.remembers(s.uid(), StepResurrected, fmt.Sprintf("receipt %d", batch)) {
		var err error
		if lsn, err = s.Ledger.Position(ctx); err != nil {
			return errored(err), true
		}
	}
	return d.replicasBehind(ctx, s, lsn, batch)
}
