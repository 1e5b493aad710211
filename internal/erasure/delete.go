package erasure

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// residueDistance is the cosine distance below which a vector counts as a
// copy of an erased embedding.
const residueDistance = 1e-6

// claimedReasons are the Deleted reasons written only after the claim: the
// deletion has been claimed and a later pass does not claim it again.
var claimedReasons = map[string]bool{
	lethev1.ReasonDeleting:           true,
	lethev1.ReasonVerificationFailed: true,
	lethev1.ReasonResidueFound:       true,
	lethev1.ReasonReplicaLagging:     true,
	lethev1.ReasonSchemaChanged:      true,
}

// Deletion is step 3: it claims the deletion, deletes in bounded batches,
// verifies, probes for residue and waits for the replicas.
type Deletion struct {
	Config Config
	// probes keeps the sampled embeddings between the deletion and the
	// residue probe, in memory only, keyed by request UID: batches that
	// ran in an earlier pass of this process sampled them.
	probes sync.Map
	// parked keeps the deletions verified and waiting for their vacuum,
	// by request UID (delete_vacuum.go).
	parked sync.Map
	// Waits remembers the position the replicas must replay (nil: none).
	Waits *ReplicaWaits
}

// Name is the step's condition type.
func (*Deletion) Name() string { return lethev1.ConditionDeleted }

func (d *Deletion) Run(ctx context.Context, s *Scope) Outcome {
	if s.isTrue(lethev1.ConditionDeleted) {
		// A restore of the database can bring the sessions back at any time
		// after the deletion: every later pass looks first, so that the
		// graph and backup steps work from a ledger back in force.
		d.forget(s.uid()) // written: a completing pass's write that failed in transit held
		return d.Reverify(ctx, s)
	}
	if !meta.IsStatusConditionTrue(s.Store.Status.Conditions, lethev1.MemoryStoreSchemaCompliant) {
		return waiting(d.Config.RetryAfter, lethev1.ConditionDeleted, lethev1.ReasonStoreNotReady,
			"the MemoryStore's SchemaCompliant is not True: a deletion could leave rows behind")
	}
	if !claimedReasons[s.reason(lethev1.ConditionDeleted)] {
		if out, claimed := d.claim(ctx, s); !claimed {
			return out
		}
	}
	if out, parked := d.unpark(ctx, s); parked {
		return out
	}
	// The position remembered for the replicas holds only while every pass
	// since it was read reached the wait: a pass that stopped short (rows or
	// residue found, a failure) saw something that someone may remove later,
	// after that position, and a replica short of the removal still serves it.
	waited := false
	defer func() {
		if !waited {
			d.Waits.forget(s.uid(), lethev1.ConditionDeleted)
		}
	}()
	res, err := s.Ledger.Delete(ctx, LedgerRequest(s.Request), d.Config.BatchSize, d.Config.ProbeBudget)
	if err != nil {
		return failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonDeleting, "deletion claimed; a batch failed and will be retried", err)
	}
	sample, known := d.sample(s.uid(), res)
	ev, work, target, err := d.verified(ctx, s, res, len(sample.embeddings))
	if err != nil {
		return failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonDeleting, "deleted; the verification failed and is retried", err)
	}
	if sessionRowsRemain(ev.Verification) {
		if out, erased := d.unheldRowsBack(ctx, s); erased {
			out.Work = work
			return out
		}
	}
	residue, failure := d.probe(ctx, s, sample, known, &ev)
	if failure != nil {
		return *failure
	}
	if out, clean := d.judge(ev, residue); !clean {
		out.Work = work
		return out
	}
	waited = true
	caughtUp, err := d.Waits.caughtUp(ctx, s, lethev1.ConditionDeleted, target.lsn, target.of)
	if err != nil || !caughtUp {
		// What was deleted is evidence already, whatever the replicas say.
		out := waiting(d.Config.ReplicaRecheck, lethev1.ConditionDeleted, lethev1.ReasonReplicaLagging,
			"waiting for every replica to replay past the deletion")
		if err != nil {
			out = failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonReplicaLagging,
				"waiting for every replica to replay past the deletion; a replica could not be asked and is retried", err)
		}
		out.Evidence, out.Work = &ev, work
		return out
	}
	return d.vacuumThenDone(ctx, s, ev, work)
}

// claim writes the intent to delete before anything is deleted. A cancel
// the request asks for (Claims.CancelRequested) cancels instead, unless the
// deletion had already started; a conflict starts the pass again.
func (d *Deletion) claim(ctx context.Context, s *Scope) (Outcome, bool) {
	cancelRequested, err := s.Claims.CancelRequested(ctx)
	if err != nil {
		return errored(err), false
	}
	if cancelRequested {
		if out, ok := cancel(ctx, s, d.Config); ok {
			if out.Kind == Errored {
				// GracePeriodElapsed is True already: the failed cancel must not undo it.
				return errored(out.Err), false
			}
			return out, false
		}
	}
	claimed, err := s.Claims.Claim(ctx, metav1.Condition{Type: lethev1.ConditionDeleted, Status: metav1.ConditionFalse,
		Reason: lethev1.ReasonDeleting, Message: "deletion claimed; deleting in bounded batches, then verifying and vacuuming"})
	if err != nil {
		return errored(err), false
	}
	if !claimed {
		return Outcome{Kind: Waiting, RequeueAfter: time.Second}, false
	}
	return Outcome{}, true
}

// evidence reports what the deletion did from its receipts — every batch,
// also those an earlier pass or an earlier manager ran — and verifies that
// nothing of the sessions the request found is left. The work is this
// pass's own batches, for the metrics.
func (d *Deletion) evidence(ctx context.Context, s *Scope, res DeleteResult, probed int) (lethev1.StepEvidence, Work, replicaTarget, error) {
	counts, sessions := sumBatches(res.Batches)
	work := Work{SessionsDeleted: sessions, Mode: mode(s.Request), RowsDeleted: counts}
	target := replicaTarget{lsn: res.CommitLSN}
	receipts, err := s.Ledger.Receipts(ctx, s.uid(), StepDeleted)
	if err != nil {
		return lethev1.StepEvidence{}, work, target, err
	}
	deletedAt, err := s.Ledger.DeletedAt(ctx, s.uid())
	if err != nil {
		return lethev1.StepEvidence{}, work, target, err
	}
	// Every erasure of the request's sessions, by this pass or not (another
	// manager, a re-erasure), moves the ledger's latest erased_at. The one
	// read with the position, not deletedAt (read after it): an erasure
	// committed between the two would otherwise count as covered.
	target.of = "erased " + res.ErasedAt.UTC().Format(time.RFC3339Nano)
	if deletedAt.IsZero() {
		deletedAt = s.Clock.Now()
	}
	checks, err := s.Ledger.Verify(ctx, FoundRequest(s.Request), res.ContentKeys)
	if err != nil {
		return lethev1.StepEvidence{}, work, target, err
	}
	total, totalCounts := receiptTotals(receipts)
	ev := lethev1.StepEvidence{Step: lethev1.ConditionDeleted, CompletedAt: mtime(deletedAt), Counts: totalCounts}
	ev.Verification = verifications(checks)
	ev.Note = fmt.Sprintf("%d session(s) deleted in %d batch(es) of at most %d; residue probe: %d of %d erased embeddings (planned) probed against every vector column outside the cascade",
		total, len(receipts), d.Config.BatchSize, probed, plannedEmbeddings(s.Request))
	if want := min(int64(d.Config.ProbeBudget), plannedEmbeddings(s.Request)); int64(probed) < want {
		// The sample is kept in memory only: batches run before a restart of
		// the manager were not sampled again.
		ev.Note += fmt.Sprintf(" (fewer than the budget of %d: the sample is kept in memory only: rows erased before a manager restart, or erased again after a restore, are not sampled)", want)
	}
	return ev, work, target, nil
}

// replicaTarget is the WAL position the replicas must replay past before
// the deletion is done, and what it covers (ReplicaWaits.caughtUp's of).
type replicaTarget struct{ lsn, of string }

// verified is evidence, after removing residue that outlived the deletion
// (a derived record or a content-keyed entry written after it by a path
// that bypassed the guards) and verifying again: what Lethe can remove is
// removed, with a receipt, rather than stalling the request.
// The replicas must replay the removal too: it commits after the
// deletion's position.
func (d *Deletion) verified(ctx context.Context, s *Scope, res DeleteResult, probed int) (lethev1.StepEvidence, Work, replicaTarget, error) {
	ev, work, target, err := d.evidence(ctx, s, res, probed)
	if err != nil || !removable(ev.Verification) {
		return ev, work, target, err
	}
	removed, err := s.Ledger.RemoveResidue(ctx, FoundRequest(s.Request))
	if err != nil || removed.Skipped {
		return ev, work, target, err
	}
	ev, work, target, err = d.evidence(ctx, s, res, probed)
	target = replicaTarget{lsn: removed.CommitLSN, of: target.of + "; residue removed " + removed.CommitLSN}
	ev.Note += fmt.Sprintf("; residue that outlived the deletion removed (%s receipt %d): %d derived record(s), %d content-keyed entr(ies)",
		StepResidueRemoved, removed.Batch, removed.DerivedRecords, removed.ContentIndexEntries)
	return ev, work, target, err
}

// verifications are the checks as evidence.
func verifications(checks []Verification) []lethev1.Verification {
	out := make([]lethev1.Verification, 0, len(checks))
	for _, c := range checks {
		out = append(out, lethev1.Verification{Check: c.Check, Found: c.Found})
	}
	return out
}

// removable reports whether a check found derived records or content-keyed
// entries of the erased sessions: residue RemoveResidue removes.
func removable(checks []lethev1.Verification) bool {
	for _, v := range checks {
		if v.Found > 0 && (strings.HasPrefix(v.Check, CheckPrefixDerived) || strings.HasPrefix(v.Check, CheckPrefixContent)) {
			return true
		}
	}
	return false
}

// Verification checks of the residue probes: residue, not rows left.
const (
	vectorResidueCheck = "near-identical vectors in "
	textResidueCheck   = "verbatim copies of erased text in "
)

// residues are the copies the probes found, per probe.
type residues struct{ vectors, texts []Residue }

// probe runs the text residue probe, then the vector one (the step's last
// database call before its status write), and records what they looked
// at and found in ev; a failed probe is an outcome.
func (d *Deletion) probe(ctx context.Context, s *Scope, sample probeSample, known bool, ev *lethev1.StepEvidence) (residues, *Outcome) {
	var found residues
	var tp TextProbe
	if len(sample.texts) > 0 {
		var err error
		if tp, err = s.Ledger.ProbeTextResidue(ctx, sample.texts); err != nil {
			out := failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonDeleting, "deleted; the text residue probe failed and is retried", err)
			return found, &out
		}
		found.texts = tp.Residue
	}
	ev.Note += textProbeNote(sample, known, d.Config.ProbeBudget, tp)
	vecs, err := s.Ledger.ProbeResidue(ctx, sample.embeddings, residueDistance)
	if err != nil {
		// E.g. a vector column the manager's role may not read.
		out := failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonDeleting,
			"deleted; the residue probe failed and is retried (the manager's role needs SELECT on every vector column)", err)
		return found, &out
	}
	found.vectors = vecs
	for _, r := range found.texts {
		ev.Verification = append(ev.Verification, lethev1.Verification{Check: textResidueCheck + r.Column, Found: r.Found})
	}
	for _, r := range found.vectors {
		ev.Verification = append(ev.Verification, lethev1.Verification{Check: vectorResidueCheck + r.Column, Found: r.Found})
	}
	return found, nil
}

// textProbeNote says how much of the erased text the text probe looked for
// and where: counts only.
func textProbeNote(sample probeSample, known bool, budget int, tp TextProbe) string {
	if budget <= 0 {
		return "; text probe: none (the probe budget is 0)"
	}
	if !known {
		return "; text probe: no sample (the sample is kept in memory only: rows erased before a manager restart, or erased again after a restore, are not sampled)"
	}
	if len(sample.texts) == 0 {
		return fmt.Sprintf("; text probe: no text of %d words or more in the %d deleted row(s), nothing to probe",
			TextPassageMinWords, sample.textRows)
	}
	note := fmt.Sprintf("; text probe: %d passage(s) of %d+ words sampled from the text of %d deleted row(s), probed against %d text column(s) outside the cascade",
		len(sample.texts), TextPassageMinWords, sample.textRows, tp.Columns)
	if tp.Unreadable > 0 || tp.Excluded > 0 {
		note += fmt.Sprintf(" (%d not readable by the manager's role, %d excluded by the store: not probed)", tp.Unreadable, tp.Excluded)
	}
	return note
}

// receiptTotals adds up the Deleted receipts: sessions, and rows per table
// (tables sorted, the content-keyed entries and derived records last).
func receiptTotals(receipts map[int]StepReceipt) (int, []lethev1.TableCount) {
	sessions := 0
	total := map[string]int64{}
	for _, r := range receipts {
		sessions += r.Sessions
		for k, v := range r.Counts {
			total[k] += v
		}
	}
	extra := []string{CountContentIndexEntries, CountDerivedRecords}
	var out []lethev1.TableCount
	for _, k := range slices.Sorted(maps.Keys(total)) {
		if !slices.Contains(extra, k) {
			out = append(out, lethev1.TableCount{Table: k, Rows: total[k]})
		}
	}
	for _, k := range extra {
		out = append(out, lethev1.TableCount{Table: k, Rows: total[k]})
	}
	return sessions, out
}

// rowsRemain reports whether a check found rows of the erased sessions
// (not residue, which the probes report).
func rowsRemain(checks []lethev1.Verification) bool {
	return slices.ContainsFunc(checks, func(v lethev1.Verification) bool {
		return v.Found > 0 && !strings.HasPrefix(v.Check, vectorResidueCheck) && !strings.HasPrefix(v.Check, textResidueCheck)
	})
}

// sessionRowsRemain reports whether a check found rows of the erased
// sessions themselves or of their cascade (not derived records or
// content-keyed entries, which RemoveResidue handles).
func sessionRowsRemain(checks []lethev1.Verification) bool {
	return slices.ContainsFunc(checks, func(v lethev1.Verification) bool {
		return rowsRemain([]lethev1.Verification{v}) && !removable([]lethev1.Verification{v})
	})
}

// unheldRowsBack erases again rows of the sessions that remain after the
// deletion while the ledger has no row of the request left un-erased: a
// restore of the database from before the request took the ledger (and
// the tombstones) with it, so the deletion's guard found nothing eligible.
// The request, kept by the API server, knows what it found, and its grace
// period is over (GraceWait keeps the recorded end when the ledger is
// gone). A row the ledger still has un-erased — held (a session whose
// tenant changed, a grace period not over by the database's clock) or
// cancelled — is the guard's refusal: nothing is re-erased, the step
// stalls on it.
func (d *Deletion) unheldRowsBack(ctx context.Context, s *Scope) (Outcome, bool) {
	gs, err := s.Ledger.Grace(ctx, s.uid())
	if err != nil {
		return failed(d.Config, lethev1.ConditionDeleted, lethev1.ReasonDeleting,
			"deleted; rows of the sessions remain and reading the ledger failed: retried", err), true
	}
	if gs.NotErased > 0 {
		return Outcome{}, false
	}
	return d.reeraseThenAgain(ctx, s, "after the deletion, the ledger held none of the request's sessions while the verification found them or their rows (a restored database)")
}

// judge stalls the step when rows of the erased sessions remain or a copy
// of erased content (an embedding, a passage of text) was found: a human
// must look.
func (d *Deletion) judge(ev lethev1.StepEvidence, found residues) (Outcome, bool) {
	var left []string
	for _, v := range ev.Verification {
		if rowsRemain([]lethev1.Verification{v}) {
			left = append(left, v.Check)
		}
	}
	if len(left) > 0 {
		out := stalled(d.Config.ReverifyInterval, lethev1.ConditionDeleted, lethev1.ReasonVerificationFailed,
			"rows of the erased sessions remain: "+strings.Join(left, "; "))
		out.Evidence = &ev
		return out, false
	}
	var what []string
	if len(found.vectors) > 0 {
		what = append(what, "near-identical copies of erased embeddings remain in "+columns(found.vectors))
	}
	if len(found.texts) > 0 {
		what = append(what, "verbatim copies of erased text remain in "+columns(found.texts))
	}
	if len(what) > 0 {
		out := stalled(d.Config.RetryAfter, lethev1.ConditionDeleted, lethev1.ReasonResidueFound,
			strings.Join(what, "; ")+": remove them; Lethe probes again")
		out.Evidence = &ev
		out.Warning = &Warning{Reason: lethev1.ReasonResidueFound, Action: "Verify",
			Note: fmt.Sprintf("residue found in %d column(s)", len(found.vectors)+len(found.texts))}
		return out, false
	}
	return Outcome{}, true
}

// columns names the columns of the residue.
func columns(rs []Residue) string {
	cols := make([]string, len(rs))
	for i, r := range rs {
		cols[i] = r.Column
	}
	return strings.Join(cols, ", ")
}

// ReasonVacuumIncomplete is the Warning when the vacuum after a deletion
// failed or could not vacuum every table.
const ReasonVacuumIncomplete = "VacuumIncomplete"

// probeSample is what the deletion sampled for the residue probes, kept
// in memory only.
type probeSample struct {
	embeddings []Embedding
	texts      []TextSample
	textRows   int64
}

// sample returns the probe sample of this deletion: the one just taken, or
// the one an earlier pass of this process took before the batches were
// done; known is false when neither this pass nor a kept sample saw the
// batches run (a manager restart after them).
func (d *Deletion) sample(uid string, res DeleteResult) (sample probeSample, known bool) {
	fresh := probeSample{embeddings: res.Probe, texts: res.Texts, textRows: res.TextRows}
	if len(fresh.embeddings) > 0 || len(fresh.texts) > 0 || fresh.textRows > 0 {
		d.probes.Store(uid, fresh)
		return fresh, true
	}
	if v, ok := d.probes.Load(uid); ok {
		return v.(probeSample), true
	}
	return fresh, slices.ContainsFunc(res.Batches, func(b BatchResult) bool { return !b.Skipped })
}

// forget drops what the step keeps in memory for the request.
func (d *Deletion) forget(uid string) {
	d.probes.Delete(uid)
	d.parked.Delete(uid)
	d.Waits.forget(uid, lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted)
}

// forgetAll drops everything kept for a request, the wait of a re-erasure
// after the deletion included (kept across passes until its entry is
// recorded): the request is gone.
func (d *Deletion) forgetAll(uid string) {
	d.forget(uid)
	d.Waits.forget(uid, StepResurrected)
}

func mode(er *lethev1.ErasureRequest) string {
	if er.Spec.Immediate {
		return "immediate"
	}
	return "grace"
}

// plannedEmbeddings is the number of embeddings the plan found.
func plannedEmbeddings(er *lethev1.ErasureRequest) int64 {
	if er.Status.Plan == nil {
		return 0
	}
	return er.Status.Plan.Embeddings
}

func tableCounts(cs []Count) []lethev1.TableCount {
	out := make([]lethev1.TableCount, len(cs))
	for i, c := range cs {
		out[i] = lethev1.TableCount{Table: c.Table, Rows: c.Rows}
	}
	return out
}

// sumBatches adds the per-table counts of the batches that ran in this pass.
func sumBatches(batches []BatchResult) (counts []lethev1.TableCount, sessions int) {
	idx := map[string]int{}
	for _, b := range batches {
		if b.Skipped {
			continue
		}
		sessions += b.Sessions
		for _, c := range b.Rows {
			i, ok := idx[c.Table]
			if !ok {
				i = len(counts)
				idx[c.Table] = i
				counts = append(counts, lethev1.TableCount{Table: c.Table})
			}
			counts[i].Rows += c.Rows
		}
	}
	return counts, sessions
}
