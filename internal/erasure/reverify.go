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
// The outcome is Done as soon as the primary holds the erasure again: the
// graph and backup steps and their re-checks work from that ledger and go
// on while the replicas catch up. The Deleted condition stays True; the
// wait shows as one Warning and a sooner requeue, and the Resurrected entry
// follows from the receipt (lostEntry) on the pass that finds the replicas
// caught up, as the grace period's does.
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
	r := reerasureReceipt(res)
	if out, behind := d.replicasBehind(ctx, s, res.CommitLSN, r); behind {
		return out
	}
	return resurrected(s, r)
}

// reerasureReceipt is the Resurrected receipt Reerase wrote for res, as
// Receipts reads it back: one evidence, whichever pass records the entry.
func reerasureReceipt(res BatchResult) StepReceipt {
	counts := map[string]int64{}
	for _, c := range res.Rows {
		counts[c.Table] = c.Rows
	}
	counts[CountContentIndexEntries] = res.ContentIndexEntries
	counts[CountDerivedRecords] = res.DerivedRecords
	counts[CountLedgerRowsPutBack] = res.LedgerRowsRestored
	return StepReceipt{Batch: res.Batch, Sessions: res.Sessions, Counts: counts, At: res.DeletedAt}
}

// receiptOf names a receipt for the replica wait: its batch and time, since
// a restore that takes a receipt back lets the next re-erasure reuse its
// batch number.
func receiptOf(r StepReceipt) string {
	return fmt.Sprintf("receipt %d at %d", r.Batch, r.At.UnixMicro())
}

// replicasBehind is the outcome of a re-erasure (its receipt r, committed
// before the WAL position lsn; "" the one remembered) that a replica has
// not replayed yet, or that a replica could not be asked about: Done
// without an entry, looked at again after ReplicaRecheck, with a Warning
// on the first pass that waits for this receipt only.
func (d *Deletion) replicasBehind(ctx context.Context, s *Scope, lsn string, r StepReceipt) (Outcome, bool) {
	of := receiptOf(r)
	first := !d.Waits.remembers(s.uid(), StepResurrected, of)
	caughtUp, err := d.Waits.caughtUp(ctx, s, StepResurrected, lsn, of)
	if err == nil && caughtUp {
		return Outcome{}, false
	}
	out := Outcome{Kind: Done, RequeueAfter: d.Config.ReplicaRecheck}
	if first {
		why := "a replica has not replayed that yet"
		if err != nil {
			why = "a replica could not be asked whether it replayed that"
		}
		out.Warning = &Warning{Reason: lethev1.ReasonReplicaLagging, Action: "Erase",
			Note: fmt.Sprintf("erased sessions came back and were erased again on the primary (Resurrected receipt %d); %s: the Resurrected entry is recorded once every replica has", r.Batch, why)}
	}
	return out, true
}

// reerasedAnything reports whether a re-erasure erased, put back or
// removed anything.
func reerasedAnything(r BatchResult) bool {
	return !r.Skipped && (r.Sessions > 0 || r.LedgerRowsRestored > 0 || r.DerivedRecords > 0 || r.ContentIndexEntries > 0)
}

// resurrected is the Done outcome of a re-erasure that did something, from
// its receipt: its evidence, its Resurrected history entry and a Warning.
func resurrected(s *Scope, r StepReceipt) Outcome {
	derived, content := r.Counts[CountDerivedRecords], r.Counts[CountContentIndexEntries]
	ledger := "ledger rows put back: not in the receipt (written by an earlier version)"
	if n, ok := r.Counts[CountLedgerRowsPutBack]; ok {
		ledger = fmt.Sprintf("%d ledger row(s) found missing or not erased (a restored database) put back in force", n)
	}
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: mtime(r.At), Counts: resurrectedCounts(r),
		Note: fmt.Sprintf("%d resurrected session(s) erased again; %s; residue removed: %d derived record(s), %d content-keyed entr(ies)",
			r.Sessions, ledger, derived, content)}
	return Outcome{Kind: Done, Evidence: &ev,
		Milestone: &Milestone{Phase: s.Request.Status.Phase, Event: lethev1.ReasonResurrected, At: r.At, Evidence: ev, Note: ev.Note},
		Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Erase",
			Note: fmt.Sprintf("%d erased session(s) reappeared and were erased again; %d ledger row(s) put back; %d residue record(s) removed",
				r.Sessions, r.Counts[CountLedgerRowsPutBack], derived+content)},
	}
}

// resurrectedCounts are a receipt's table counts, sorted by table, then
// the residue and ledger counts.
func resurrectedCounts(r StepReceipt) []lethev1.TableCount {
	last := []string{CountContentIndexEntries, CountDerivedRecords, CountLedgerRowsPutBack}
	out := make([]lethev1.TableCount, 0, len(r.Counts))
	for _, k := range slices.Sorted(maps.Keys(r.Counts)) {
		if !slices.Contains(last, k) {
			out = append(out, lethev1.TableCount{Table: k, Rows: r.Counts[k]})
		}
	}
	for _, k := range last {
		if n, ok := r.Counts[k]; ok {
			out = append(out, lethev1.TableCount{Table: k, Rows: n})
		}
	}
	return out
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
	if out, behind := d.lostBehind(ctx, s, r); behind {
		return out
	}
	if r.At.IsZero() {
		r.At = s.Clock.Now()
	}
	return resurrected(s, r)
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

// lostBehind is replicasBehind for a receipt whose re-erasure this process
// did not see commit (or whose position it forgot): the position waited
// for is the one remembered, else the primary's now, later than needed,
// which is safe.
func (d *Deletion) lostBehind(ctx context.Context, s *Scope, r StepReceipt) (Outcome, bool) {
	lsn := ""
	if !d.Waits.remembers(s.uid(), StepResurrected, receiptOf(r)) {
		var err error
		if lsn, err = s.Ledger.Position(ctx); err != nil {
			return errored(err), true
		}
	}
	return d.replicasBehind(ctx, s, lsn, r)
}
