package erasure

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func runDeletion(ctx context.Context, s *Scope) Outcome {
	return (&Deletion{Config: testConfig}).Run(ctx, s)
}

func reverifyDeletion(ctx context.Context, s *Scope) Outcome {
	return (&Deletion{Config: testConfig}).Reverify(ctx, s)
}

var (
	// deletedAt is when the last batch committed, by the database's clock.
	deletedAt  = dbNow.Add(6*time.Minute + 650*time.Millisecond)
	vacuumedAt = deletedAt.Add(2 * time.Second)
	sample     = []Embedding{{0.1, 0.2}, {0.3, 0.4}}
	texts      = []TextSample{"the first erased passage", "the second erased passage"}
	clean      = []Verification{{Check: "sessions of the request", Found: 0}, {Check: "rows in memory.messages", Found: 0}}
)

const (
	cancelRequestedCall = "Claims.CancelRequested()"
	claimCall           = "Claims.Claim(Deleted=False/Deleting)"
	deleteCall          = "Ledger.Delete({req-uid [s1 s2 s3] grace=168h0m0s}, 50, 8)"
	verifyCall          = "Ledger.Verify({req-uid [s1 s2 s3] grace=0s}, 3 content keys)"
	// verifyNoKeysCall is a verification without content keys: repeated
	// by a pass that finds the deletion parked, or after a deletion that
	// erased nothing in its pass. The keys are not kept across passes.
	verifyNoKeysCall        = "Ledger.Verify({req-uid [s1 s2 s3] grace=0s}, no content keys)"
	probeCall               = "Ledger.ProbeResidue([[0.1 0.2] [0.3 0.4]], 1e-06)"
	textProbeCall           = "Ledger.ProbeTextResidue([[text] [text]])"
	replicaCall             = "Replicas.CaughtUp(0/3000060)"
	vacuumCall              = "Ledger.Vacuum(Lazy)"
	deletedReceiptsCall     = "Ledger.Receipts(req-uid, Deleted)"
	resurrectedReceiptsCall = "Ledger.Receipts(req-uid, Resurrected)"
	reeraseCall             = "Ledger.Reerase({req-uid [s1 s2 s3] grace=0s})"
	ledgerRowsCall          = "Ledger.Grace(req-uid)"
)

// deletedReceipts are the receipts of deleteResult's batches: batch 1 ran in
// an earlier pass, so its counts come only from its receipt.
func deletedReceipts() map[int]StepReceipt {
	return map[int]StepReceipt{
		0: {Batch: 0, Sessions: 2, Counts: map[string]int64{"memory.sessions": 2, "memory.messages": 30, CountContentIndexEntries: 2, CountDerivedRecords: 1}},
		1: {Batch: 1, Sessions: 1, Counts: map[string]int64{"memory.sessions": 1, "memory.messages": 5}},
		2: {Batch: 2, Sessions: 1, Counts: map[string]int64{"memory.sessions": 1, "memory.messages": 10, CountContentIndexEntries: 1}},
	}
}

// deleteResult is three batches: two ran, the middle one was done before.
func deleteResult() DeleteResult {
	return DeleteResult{Batches: []BatchResult{
		{Batch: 0, Sessions: 2, Rows: []Count{{Table: "memory.sessions", Rows: 2}, {Table: "memory.messages", Rows: 30}},
			ContentIndexEntries: 2, DerivedRecords: 1, DeletedAt: dbNow.Add(5 * time.Minute)},
		{Batch: 1, Skipped: true},
		{Batch: 2, Sessions: 1, Rows: []Count{{Table: "memory.sessions", Rows: 1}, {Table: "memory.messages", Rows: 10}},
			ContentIndexEntries: 1, DeletedAt: deletedAt},
	}, Probe: sample, Texts: texts, TextRows: 45, CommitLSN: "0/3000060", ContentKeys: ContentKeys{"sha-1", "sha-2", "sha-3"}}
}

// deletionFakes is a deletion that claims, deletes, verifies clean, finds
// no residue and whose replicas caught up; mods change it.
func deletionFakes(mods ...func(*fakes)) fakes {
	f := fakes{
		claims: ClaimsFns{CancelRequestedFn: func(context.Context) (bool, error) { return false, nil },
			ClaimFn: func(context.Context, metav1.Condition) (bool, error) { return true, nil }},
		ledger: LedgerFns{
			DeleteFn:    func(context.Context, Request, int, int) (DeleteResult, error) { return deleteResult(), nil },
			VerifyFn:    func(context.Context, Request, ContentKeys) ([]Verification, error) { return clean, nil },
			ReceiptsFn:  func(context.Context, string, string) (map[int]StepReceipt, error) { return deletedReceipts(), nil },
			DeletedAtFn: func(context.Context, string) (time.Time, error) { return deletedAt, nil },
			VacuumFn: func(context.Context, lethev1.VacuumMode) (VacuumResult, error) {
				return VacuumResult{Vacuumed: 9, At: vacuumedAt}, nil
			},
			ProbeResidueFn: func(context.Context, []Embedding, float64) ([]Residue, error) { return nil, nil },
			ProbeTextResidueFn: func(context.Context, []TextSample) (TextProbe, error) {
				return TextProbe{Columns: 5}, nil
			},
		},
		replicas: func(context.Context, string) (bool, error) { return true, nil },
	}
	for _, m := range mods {
		m(&f)
	}
	return f
}

// deletedEvidence is the evidence of deleteResult, from its receipts, with the checks found.
func deletedEvidence(checks ...lethev1.Verification) lethev1.StepEvidence {
	return lethev1.StepEvidence{Step: lethev1.ConditionDeleted, CompletedAt: secs(deletedAt),
		Counts: []lethev1.TableCount{{Table: "memory.messages", Rows: 45}, {Table: "memory.sessions", Rows: 4},
			{Table: CountContentIndexEntries, Rows: 3}, {Table: CountDerivedRecords, Rows: 1}},
		Verification: checks,
		Note: "4 session(s) deleted in 3 batch(es) of at most 50; residue probe: 2 of 12 erased embeddings (planned) " +
			"probed against every vector column outside the cascade (fewer than the budget of 8: the sample is kept in memory only: rows erased before a manager restart, or erased again after a restore, are not sampled)" +
			textNote}
}

// vacuumed is the evidence after the vacuum that ends the step.
func vacuumed(ev lethev1.StepEvidence) lethev1.StepEvidence {
	ev.Counts = append(slices.Clone(ev.Counts), lethev1.TableCount{Table: CountTablesVacuumed + " (Lazy)", Rows: 9})
	ev.VacuumedAt = secs(vacuumedAt)
	return ev
}

const textNote = "; text probe: 2 passage(s) of 16+ words sampled from the text of 45 deleted row(s), probed against 5 text column(s) outside the cascade"

var cleanChecks = []lethev1.Verification{{Check: "sessions of the request", Found: 0}, {Check: "rows in memory.messages", Found: 0}}

// deleted is the Done outcome of deleteResult.
func deleted(mode string) Outcome {
	ev := vacuumed(deletedEvidence(cleanChecks...))
	return Outcome{Kind: Done, Evidence: &ev,
		Condition: &Condition{Type: lethev1.ConditionDeleted, OK: true, Reason: lethev1.ReasonSessionsDeleted,
			Message: "the sessions, every row cascading from them, their content-keyed entries and derived records are deleted and verified absent"},
		Milestone: &Milestone{Phase: lethev1.PhaseDeleted, At: secs(deletedAt).Time, Evidence: ev, Note: ev.Note},
		Work: Work{SessionsDeleted: 3, Mode: mode,
			RowsDeleted: []lethev1.TableCount{{Table: "memory.sessions", Rows: 3}, {Table: "memory.messages", Rows: 40}}},
		Persisted: func() {}}
}

func deletedStatus(er *lethev1.ErasureRequest, out Outcome) recorded {
	return after(er, withCond(out.Condition), withEvidence(*out.Evidence), withEntry(lethev1.PhaseDeleted, "", deletedAt))
}

func TestDeletionClaim(t *testing.T) {
	notReady := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonStoreNotReady,
		Message: "the MemoryStore's SchemaCompliant is not True: a deletion could leave rows behind"}
	claimed := reached(2, withStatusCondition(lethev1.ConditionDeleted, false, lethev1.ReasonDeleting))
	claimedPaused := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonDeleting,
		Message: "deletion claimed; StoreNotReady: the MemoryStore's SchemaCompliant is not True: a deletion could leave rows behind"}
	lifted := Outcome{Kind: Ended, Condition: cancelledCond,
		Evidence:  &lethev1.StepEvidence{Step: lethev1.ReasonCancelled, CompletedAt: secs(dbNow), Note: "3 tombstone(s) lifted; the ledger marks the request cancelled"},
		Milestone: &Milestone{Phase: lethev1.PhaseCancelled, At: dbNow, Evidence: map[string]int64{"tombstonesLifted": 3}, Note: "cancelled: tombstones lifted"}}
	cancelSeen := func(err error) func(*fakes) {
		return func(f *fakes) {
			f.claims.CancelRequestedFn = func(context.Context) (bool, error) { return true, nil }
			f.ledger.CancelFn = cancelReturns(Cancellation{Lifted: 3, At: dbNow}, err)
		}
	}
	runCases(t, runDeletion, map[string]stepCase{
		"AlreadyDeleted": {reason: "A True condition is done after the re-erasure check (a restore may have brought the sessions back); nothing came back.",
			er: reached(3), fakes: fakes{ledger: LedgerFns{ReeraseFn: func(context.Context, Request) (BatchResult, error) { return BatchResult{Skipped: true}, nil },
				ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) { return nil, nil }}},
			want: stepWant{out: Outcome{Kind: Done}, status: after(reached(3)), calls: []string{"Ledger.Reerase({req-uid [s1 s2 s3] grace=0s})", resurrectedReceiptsCall}}},
		"StoreNotSchemaCompliant": {reason: "A store whose schema audit failed could leave rows behind: wait, claim nothing, delete nothing.",
			er: atDeletion(), store: newStore(notCompliant),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: notReady, RequeueAfter: testConfig.RetryAfter}, status: after(atDeletion(), withCond(notReady))}},
		"ClaimedStoreNotSchemaCompliant": {reason: "A claimed deletion paused for the store keeps a claimed reason: a later pass must not claim again (and honour a cancel that came after the claim).",
			er: claimed, store: newStore(notCompliant),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: notReady, RequeueAfter: testConfig.RetryAfter}, status: after(claimed, withCond(claimedPaused))}},
		"ClaimConflict": {reason: "The request changed since the uncached read: start the pass again in a second; Delete is not called.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.claims.ClaimFn = func(context.Context, metav1.Condition) (bool, error) { return false, nil }
			}),
			want: stepWant{out: Outcome{Kind: Waiting, RequeueAfter: time.Second}, status: after(atDeletion()), calls: []string{cancelRequestedCall, claimCall}}},
		"CancelSeenAtClaim": {reason: "A cancel the cache had not shown yet, seen by the uncached read, cancels instead of claiming.",
			er: atDeletion(), fakes: deletionFakes(cancelSeen(nil)),
			want: stepWant{out: lifted, calls: []string{cancelRequestedCall, "Ledger.Cancel(req-uid)"},
				status: after(atDeletion(), withCond(cancelledCond), withEvidence(*lifted.Evidence), withEntry(lethev1.PhaseCancelled, "", dbNow))}},
		"CancelSeenTooLate": {reason: "A cancel seen after the deletion started is ignored: claim and delete.",
			er: atDeletion(), fakes: deletionFakes(cancelSeen(ErrTooLateToCancel)),
			want: stepWant{out: deleted("grace"), status: deletedStatus(atDeletion(), deleted("grace")),
				calls: []string{cancelRequestedCall, "Ledger.Cancel(req-uid)", claimCall, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall, vacuumCall}}},
		"AlreadyClaimed": {reason: "A deletion claimed in an earlier pass (reason Deleting) is not claimed again.",
			er: claimed, fakes: deletionFakes(func(f *fakes) { f.claims = ClaimsFns{} }),
			want: stepWant{out: deleted("grace"), status: deletedStatus(claimed, deleted("grace")),
				calls: []string{deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall, vacuumCall}}},
		"CancelFailsAtClaim": {reason: "A cancel seen at claim time that the database fails to write is an error; GracePeriodElapsed, True already, stays True.",
			er: atDeletion(), fakes: deletionFakes(cancelSeen(errPort)),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(atDeletion()),
				calls: []string{cancelRequestedCall, "Ledger.Cancel(req-uid)"}}},
		"CancelReadError": {reason: "The uncached read failing is an error; no condition changes, nothing is claimed.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.claims.CancelRequestedFn = func(context.Context) (bool, error) { return false, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(atDeletion()), calls: []string{cancelRequestedCall}}},
		"ClaimError": {reason: "The claim failing to be written is an error; Delete is not called.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.claims.ClaimFn = func(context.Context, metav1.Condition) (bool, error) { return false, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(atDeletion()), calls: []string{cancelRequestedCall, claimCall}}},
	})
}

func TestDeletionRun(t *testing.T) {
	claims := []string{cancelRequestedCall, claimCall}
	deleting := func(msg string) *Condition {
		return &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonDeleting, Message: msg}
	}
	batchFailed := deleting("deletion claimed; a batch failed and will be retried")
	verifyFailed := deleting("deleted; the verification failed and is retried")
	probeFailed := deleting("deleted; the residue probe failed and is retried (the manager's role needs SELECT on every vector column)")
	textProbeFailed := deleting("deleted; the text residue probe failed and is retried")
	configCond := &Condition{Type: lethev1.ConditionDeleted, Reason: errConfig.Reason, Message: errConfig.Message}
	lagging := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonReplicaLagging, Message: "waiting for every replica to replay past the deletion"}
	deletedEv := ptr(deletedEvidence(cleanChecks...)) // before the vacuum: the replicas come first
	vacuumFailed := deleted("grace")
	vfEv := deletedEvidence(cleanChecks...)
	vfEv.Counts = append(vfEv.Counts, lethev1.TableCount{Table: CountTablesVacuumed + " (Lazy, failed)", Rows: 2})
	vacuumFailed.Evidence, vacuumFailed.Milestone.Evidence = &vfEv, vfEv
	vacuumFailed.Warning = &Warning{Reason: ReasonVacuumIncomplete, Action: "Vacuum",
		Note: "the vacuum after the deletion failed after 2 table(s); the erased tuples stay in the data files until autovacuum removes them"}
	// deletedWithout is the Done outcome without a vacuum.
	deletedWithout := func() Outcome {
		out := deleted("grace")
		ev := deletedEvidence(cleanChecks...)
		out.Evidence, out.Milestone.Evidence, out.Milestone.Note = &ev, ev, ev.Note
		return out
	}
	notPermitted := deleted("grace")
	npEv := vacuumed(deletedEvidence(cleanChecks...))
	npEv.Counts = append(npEv.Counts, lethev1.TableCount{Table: CountTablesNotVacuumed, Rows: 2})
	notPermitted.Evidence, notPermitted.Milestone.Evidence = &npEv, npEv
	notPermitted.Warning = &Warning{Reason: ReasonVacuumIncomplete, Action: "Vacuum",
		Note: "2 table(s) not vacuumed: the manager's role neither owns them nor holds MAINTAIN; the erased tuples stay in their data files until autovacuum removes them"}
	replicaDown := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonReplicaLagging,
		Message: "waiting for every replica to replay past the deletion; a replica could not be asked and is retried"}
	deleteFails := func(err error) func(*fakes) {
		return func(f *fakes) {
			f.ledger.DeleteFn = func(context.Context, Request, int, int) (DeleteResult, error) { return DeleteResult{}, err }
		}
	}
	caughtUp := func(ok bool, err error) func(*fakes) {
		return func(f *fakes) { f.replicas = func(context.Context, string) (bool, error) { return ok, err } }
	}
	runCases(t, runDeletion, map[string]stepCase{
		"Done": {reason: "Deleted, verified absent, no residue, replicas caught up: done, with the batches' counts as evidence and work.",
			er: atDeletion(), fakes: deletionFakes(),
			want: stepWant{out: deleted("grace"), status: deletedStatus(atDeletion(), deleted("grace")),
				calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall, vacuumCall)}},
		"DoneImmediate": {reason: "The work of an immediate request counts as immediate; the ledger is asked for no grace period.",
			er: reached(2, immediate), fakes: deletionFakes(),
			want: stepWant{out: deleted("immediate"), status: deletedStatus(atDeletion(), deleted("immediate")),
				calls: append(claims, "Ledger.Delete({req-uid [s1 s2 s3] grace=0s}, 50, 8)", deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall, vacuumCall)}},
		"DeleteError": {reason: "A failed batch is an error for a retry; the condition keeps the claim's reason, so it is not claimed again.",
			er: atDeletion(), fakes: deletionFakes(deleteFails(errPort)),
			want: stepWant{out: Outcome{Kind: Errored, Condition: batchFailed}, err: errPort,
				status: after(atDeletion(), withCond(batchFailed)), calls: append(claims, deleteCall)}},
		"DeleteConfigError": {reason: "A configuration a human must fix waits with its reason and message.",
			er: atDeletion(), fakes: deletionFakes(deleteFails(errConfig)),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: configCond, RequeueAfter: testConfig.RetryAfter},
				status: after(atDeletion(), withCond(configCond)), calls: append(claims, deleteCall)}},
		"VerifyError": {reason: "A verification that could not run is an error, not a success.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.ledger.VerifyFn = func(context.Context, Request, ContentKeys) ([]Verification, error) { return nil, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored, Condition: verifyFailed}, err: errPort,
				status: after(atDeletion(), withCond(verifyFailed)), calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall)}},
		"ProbeError": {reason: "A residue probe that could not run (a column the role may not read) is an error, not a success.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.ledger.ProbeResidueFn = func(context.Context, []Embedding, float64) ([]Residue, error) { return nil, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored, Condition: probeFailed}, err: errPort,
				status: after(atDeletion(), withCond(probeFailed)), calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall)}},
		"TextProbeError": {reason: "A text residue probe that could not run is an error, not a success; the vector probe waits for the retry.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.ledger.ProbeTextResidueFn = func(context.Context, []TextSample) (TextProbe, error) { return TextProbe{}, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored, Condition: textProbeFailed}, err: errPort,
				status: after(atDeletion(), withCond(textProbeFailed)), calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall)}},
		"ReplicasLagging": {reason: "A replica behind the deletion's commit waits for it; the deletion's evidence is recorded, not its milestone.",
			er: atDeletion(), fakes: deletionFakes(caughtUp(false, nil)),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: lagging, Evidence: deletedEv, Work: deleted("grace").Work, RequeueAfter: testConfig.ReplicaRecheck},
				status: after(atDeletion(), withCond(lagging), withEvidence(*deletedEv)), calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall)}},
		"VacuumError": {reason: "A vacuum that fails (a lock timeout, the connection lost) is a warning: the step completes (the graph and the backups come next) and the evidence says it failed.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.ledger.VacuumFn = func(context.Context, lethev1.VacuumMode) (VacuumResult, error) {
					return VacuumResult{Vacuumed: 2}, errPort
				}
			}),
			want: stepWant{out: vacuumFailed, status: deletedStatus(atDeletion(), vacuumFailed),
				calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall, vacuumCall)}},
		"VacuumOff": {reason: "A store with vacuum Off: no vacuum, no vacuumedAt.",
			er: atDeletion(), store: newStore(func(s *lethev1.MemoryStore) { s.Spec.Postgres.Vacuum = lethev1.VacuumOff }), fakes: deletionFakes(),
			want: stepWant{out: deletedWithout(), status: deletedStatus(atDeletion(), deletedWithout()),
				calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall)}},
		"VacuumNotPermitted": {reason: "Tables the role may not vacuum are counted in the evidence; the step completes.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.ledger.VacuumFn = func(context.Context, lethev1.VacuumMode) (VacuumResult, error) {
					return VacuumResult{Vacuumed: 9, NotPermitted: 2, At: vacuumedAt}, nil
				}
			}),
			want: stepWant{out: notPermitted, status: deletedStatus(atDeletion(), notPermitted),
				calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall, vacuumCall)}},
		"ReplicaError": {reason: "A replica that cannot be asked is an error for a retry; the deletion's evidence is recorded.",
			er: atDeletion(), fakes: deletionFakes(caughtUp(false, errPort)),
			want: stepWant{out: Outcome{Kind: Errored, Condition: replicaDown, Evidence: deletedEv, Work: deleted("grace").Work}, err: errPort,
				status: after(atDeletion(), withCond(replicaDown), withEvidence(*deletedEv)), calls: append(claims, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall)}},
	})
}

// rowsLeft is a verification that finds rows of the erased sessions the
// ledger still holds: the deletion's guard refused them.
func rowsLeft(f *fakes) {
	f.ledger.VerifyFn = func(context.Context, Request, ContentKeys) ([]Verification, error) {
		return []Verification{{Check: "sessions of the request"}, {Check: "rows in memory.messages", Found: 4}}, nil
	}
	f.ledger.GraceFn = func(context.Context, string) (GraceState, error) { return GraceState{LedgerRows: 3, NotErased: 1}, nil }
}

// residueLeft is a probe that finds a copy of an erased embedding.
func residueLeft(f *fakes) {
	f.ledger.ProbeResidueFn = func(context.Context, []Embedding, float64) ([]Residue, error) {
		return []Residue{{Column: `"memory"."notes"."embedding"`, Found: 1}}, nil
	}
}

// textLeft is a text probe that finds copies of erased passages in two
// columns, with one column it may not read and one the store excludes.
func textLeft(f *fakes) {
	f.ledger.ProbeTextResidueFn = func(context.Context, []TextSample) (TextProbe, error) {
		return TextProbe{Columns: 5, Unreadable: 1, Excluded: 2,
			Residue: []Residue{{Column: "public.notes.body", Found: 2}, {Column: "archive.exports.payload", Found: 1}}}, nil
	}
}

func TestDeletionJudge(t *testing.T) {
	calls := []string{cancelRequestedCall, claimCall, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall}
	left := []lethev1.Verification{{Check: "sessions of the request", Found: 0}, {Check: "rows in memory.messages", Found: 4}}
	leftEv := deletedEvidence(left...)
	leftCond := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonVerificationFailed,
		Message: "rows of the erased sessions remain: rows in memory.messages"}
	residueEv := deletedEvidence(append(cleanChecks, lethev1.Verification{Check: `near-identical vectors in "memory"."notes"."embedding"`, Found: 1})...)
	residueCond := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonResidueFound,
		Message: `near-identical copies of erased embeddings remain in "memory"."notes"."embedding": remove them; Lethe probes again`}
	textEv := deletedEvidence(append(cleanChecks,
		lethev1.Verification{Check: "verbatim copies of erased text in public.notes.body", Found: 2},
		lethev1.Verification{Check: "verbatim copies of erased text in archive.exports.payload", Found: 1})...)
	textEv.Note = strings.TrimSuffix(textEv.Note, textNote) + textNote +
		" (1 not readable by the manager's role, 2 excluded by the store: not probed)"
	textCond := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonResidueFound,
		Message: "verbatim copies of erased text remain in public.notes.body, archive.exports.payload: remove them; Lethe probes again"}
	bothEv := textEv
	bothEv.Verification = append(slices.Clone(textEv.Verification), lethev1.Verification{Check: `near-identical vectors in "memory"."notes"."embedding"`, Found: 1})
	bothCond := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonResidueFound,
		Message: `near-identical copies of erased embeddings remain in "memory"."notes"."embedding"; ` +
			"verbatim copies of erased text remain in public.notes.body, archive.exports.payload: remove them; Lethe probes again"}
	runCases(t, runDeletion, map[string]stepCase{
		"TextResidueFound": {reason: "A verbatim copy of erased text outside the cascade stalls the step like an embedding's: columns named, counts in the evidence, never the text.",
			er: atDeletion(), fakes: deletionFakes(textLeft),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: textCond, Evidence: &textEv, Work: deleted("grace").Work, RequeueAfter: testConfig.RetryAfter,
				Warning: &Warning{Reason: lethev1.ReasonResidueFound, Action: "Verify", Note: "residue found in 2 column(s)"}},
				status: after(atDeletion(), withCond(textCond), withEvidence(textEv)), calls: calls}},
		"BothResidues": {reason: "Copies of embeddings and of text: one stall naming both.",
			er: atDeletion(), fakes: deletionFakes(residueLeft, textLeft),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: bothCond, Evidence: &bothEv, Work: deleted("grace").Work, RequeueAfter: testConfig.RetryAfter,
				Warning: &Warning{Reason: lethev1.ReasonResidueFound, Action: "Verify", Note: "residue found in 3 column(s)"}},
				status: after(atDeletion(), withCond(bothCond), withEvidence(bothEv)), calls: calls}},
		"VerificationFindsRows": {reason: "Rows of the erased sessions remain: a human must look; checked again after the re-verification interval.",
			er: atDeletion(), fakes: deletionFakes(rowsLeft),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: leftCond, Evidence: &leftEv, Work: deleted("grace").Work, RequeueAfter: testConfig.ReverifyInterval},
				status: after(atDeletion(), withCond(leftCond), withEvidence(leftEv)),
				calls:  []string{cancelRequestedCall, claimCall, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, ledgerRowsCall, textProbeCall, probeCall}}},
		"VerificationFindsRowsNothingToReerase": {reason: "Rows remain, the ledger holds none of them, and the re-erasure finds nothing to act on: the step stalls on them.",
			er: atDeletion(), fakes: deletionFakes(rowsLeft, func(f *fakes) {
				f.ledger.GraceFn = func(context.Context, string) (GraceState, error) { return GraceState{LedgerRows: 3}, nil }
				f.ledger.ReeraseFn = func(context.Context, Request) (BatchResult, error) { return BatchResult{Skipped: true}, nil }
			}),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: leftCond, Evidence: &leftEv, Work: deleted("grace").Work, RequeueAfter: testConfig.ReverifyInterval},
				status: after(atDeletion(), withCond(leftCond), withEvidence(leftEv)),
				calls:  []string{cancelRequestedCall, claimCall, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, ledgerRowsCall, reeraseCall, textProbeCall, probeCall}}},
		"ResidueFound": {reason: "A near-identical copy of an erased embedding outside the cascade stalls the step, with a Warning.",
			er: atDeletion(), fakes: deletionFakes(residueLeft),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: residueCond, Evidence: &residueEv, Work: deleted("grace").Work, RequeueAfter: testConfig.RetryAfter,
				Warning: &Warning{Reason: lethev1.ReasonResidueFound, Action: "Verify", Note: "residue found in 1 column(s)"}},
				status: after(atDeletion(), withCond(residueCond), withEvidence(residueEv)), calls: calls}},
	})
}

// TestDeletionErasesAgainRowsTheLedgerNoLongerHolds: rows of the sessions
// remain after the deletion and the ledger holds none of them (a restore
// of a dump taken before the request took the ledger and the tombstones:
// the guard found nothing eligible). The pass erases them again from what
// the request found, records the resurrection, keeps Deleted False, and
// the next pass deletes (skipping), verifies, probes and vacuums anew.
func TestDeletionErasesAgainRowsTheLedgerNoLongerHolds(t *testing.T) {
	// The ledger has none of the request's rows: a restore of a dump from before the request.
	unheld := func(f *fakes) {
		f.ledger.GraceFn = func(context.Context, string) (GraceState, error) { return GraceState{}, nil }
	}
	t.Run("erased again, then deleted anew", func(t *testing.T) {
		d := &Deletion{Config: testConfig}
		reerased := BatchResult{Sessions: 2, LedgerRowsRestored: 3, Rows: []Count{{Table: "memory.sessions", Rows: 2}}, DeletedAt: deletedAt.Add(time.Minute)}
		first := runFakes(t, d.Run, atDeletion(), deletionFakes(rowsLeft, unheld, func(f *fakes) {
			f.ledger.ReeraseFn = func(context.Context, Request) (BatchResult, error) { return reerased, nil }
		}))
		out := first.out
		if out.Kind != Waiting || out.Condition == nil || out.Condition.OK || out.Condition.Reason != lethev1.ReasonDeleting ||
			out.Milestone == nil || out.Milestone.Event != lethev1.ReasonResurrected || out.Warning == nil || out.Persisted != nil {
			t.Fatalf("pass that found unheld rows and erased them again: %+v: want Waiting, Deleted still False (Deleting), a Resurrected entry and warning", out)
		}
		if !strings.Contains(out.Condition.Message, "the ledger held none of the request's sessions") {
			t.Errorf("Deleted message %q does not say why the rows were erased again", out.Condition.Message)
		}
		if diff := cmp.Diff([]string{cancelRequestedCall, claimCall, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, ledgerRowsCall, reeraseCall}, first.calls); diff != "" {
			t.Errorf("calls: -want (no probe of a deletion about to run again), +got:\n%s", diff)
		}
		if out.Work.SessionsDeleted != deleted("grace").Work.SessionsDeleted {
			t.Errorf("work %+v: the pass's own batches are still counted", out.Work)
		}
		next := runFakes(t, d.Run, first.er, deletionFakes(func(f *fakes) { f.claims = ClaimsFns{} }))
		if next.out.Kind != Done || next.out.Condition == nil || !next.out.Condition.OK {
			t.Fatalf("pass after the re-erasure: %+v: want the deletion run again to Done", next.out)
		}
		if diff := cmp.Diff([]string{deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall, vacuumCall}, next.calls); diff != "" {
			t.Errorf("pass after the re-erasure: calls: -want, +got:\n%s", diff)
		}
	})
	t.Run("a cancelled row left", func(t *testing.T) {
		out := runFakes(t, runDeletion, atDeletion(), deletionFakes(rowsLeft, func(f *fakes) {
			f.ledger.GraceFn = func(context.Context, string) (GraceState, error) { return GraceState{LedgerRows: 2, NotErased: 1}, nil }
		})).out
		if out.Kind != Stalled || out.Condition == nil || out.Condition.Reason != lethev1.ReasonVerificationFailed {
			t.Fatalf("pass with a ledger row not erased (held or cancelled): %+v: want a stall, nothing re-erased", out)
		}
	})
	t.Run("the ledger cannot be read", func(t *testing.T) {
		out := runFakes(t, runDeletion, atDeletion(), deletionFakes(rowsLeft, func(f *fakes) {
			f.ledger.GraceFn = func(context.Context, string) (GraceState, error) { return GraceState{}, errPort }
		})).out
		if out.Kind != Errored || out.Condition == nil || out.Condition.OK || out.Evidence != nil {
			t.Fatalf("pass whose ledger read failed: %+v: want a retry, Deleted not True, no evidence", out)
		}
	})
	t.Run("the re-erasure fails", func(t *testing.T) {
		out := runFakes(t, runDeletion, atDeletion(), deletionFakes(rowsLeft, unheld, func(f *fakes) {
			f.ledger.ReeraseFn = func(context.Context, Request) (BatchResult, error) { return BatchResult{}, errPort }
		})).out
		if out.Kind != Errored || out.Condition == nil || out.Condition.OK || out.Evidence != nil {
			t.Fatalf("pass whose re-erasure failed: %+v: want a retry, Deleted not True, no evidence", out)
		}
	})
}

// TestDeletionKeepsProbeSample runs two passes on one *Deletion: the first
// deletes and samples but waits for a replica; the second finds every batch
// done (no fresh sample) and must probe with the first pass's sample.
func TestDeletionKeepsProbeSample(t *testing.T) {
	d := &Deletion{Config: testConfig}
	run := func(ctx context.Context, s *Scope) Outcome { return d.Run(ctx, s) }
	first := runFakes(t, run, atDeletion(), deletionFakes(func(f *fakes) {
		f.replicas = func(context.Context, string) (bool, error) { return false, nil }
	}))
	if first.out.Kind != Waiting {
		t.Fatalf("first pass: kind %d, want Waiting for the replica", first.out.Kind)
	}
	second := runFakes(t, run, first.er, deletionFakes(func(f *fakes) {
		f.ledger.DeleteFn = func(context.Context, Request, int, int) (DeleteResult, error) {
			return DeleteResult{Batches: []BatchResult{{Batch: 0, Skipped: true}, {Batch: 1, Skipped: true}}, CommitLSN: "0/3000060"}, nil
		}
	}))
	if second.out.Kind != Done {
		t.Fatalf("second pass: kind %d, want Done", second.out.Kind)
	}
	// The first pass claimed the deletion (ReplicaLagging comes after the claim): the second does not claim again.
	if diff := cmp.Diff([]string{deleteCall, deletedReceiptsCall, deletedAtCall, verifyNoKeysCall, textProbeCall, probeCall, replicaCall, vacuumCall}, second.calls); diff != "" {
		t.Errorf("second pass: ProbeResidue must receive the first pass's sample: -want, +got:\n%s", diff)
	}
	if _, kept := d.probes.Load(uid); !kept {
		t.Error("the sample was forgotten before the completing outcome was written")
	}
	second.out.Persisted()
	if _, kept := d.probes.Load(uid); kept {
		t.Error("the sample is still kept after the completing outcome was written: it must be forgotten")
	}
	// The batches ran in the first pass: the evidence counts them from their
	// receipts (it said "0 session(s) deleted" when it summed this pass's batches).
	if n := second.er.Status.Evidence.Steps[0].Note; n != "4 session(s) deleted in 3 batch(es) of at most 50; residue probe: 2 of 12 erased embeddings "+
		"(planned) probed against every vector column outside the cascade (fewer than the budget of 8: the sample is kept in memory only: rows erased before a manager restart, or erased again after a restore, are not sampled)"+textNote {
		t.Errorf("second pass evidence note %q: want the receipts' counts and the kept sample's size", n)
	}
}

// ran is one pass run by runFakes.
type ran struct {
	out   Outcome
	er    *lethev1.ErasureRequest
	calls []string
}

// runFakes runs one pass of run on er with f and records its outcome.
func runFakes(t *testing.T, run stepFn, er *lethev1.ErasureRequest, f fakes) ran {
	t.Helper()
	out, got, calls := runCase(t, run, stepCase{reason: "pass", er: er, fakes: f})
	checkInvariants(t, out, got)
	return ran{out: out, er: got, calls: calls}
}

func TestDeletionReverify(t *testing.T) {
	reerase := func(res BatchResult, err error) fakes {
		return fakes{ledger: LedgerFns{ReeraseFn: func(context.Context, Request) (BatchResult, error) { return res, err },
			ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) { return nil, nil }},
			replicas: func(context.Context, string) (bool, error) { return true, nil }}
	}
	back := BatchResult{Batch: 4, Sessions: 2, Rows: []Count{{Table: "memory.sessions", Rows: 2}, {Table: "memory.messages", Rows: 7}}, DeletedAt: dbNow, CommitLSN: "0/3000060"}
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: secs(dbNow),
		Note: "2 resurrected session(s) erased again; 0 ledger row(s) found missing or not erased (a restored database) put back in force; " +
			"residue removed: 0 derived record(s), 0 content-keyed entr(ies)",
		Counts: []lethev1.TableCount{{Table: "memory.messages", Rows: 7}, {Table: "memory.sessions", Rows: 2},
			{Table: CountContentIndexEntries}, {Table: CountDerivedRecords}, {Table: "erasure ledger rows put back", Rows: 0}}}
	restored := BatchResult{Batch: 5, LedgerRowsRestored: 3, DeletedAt: dbNow, CommitLSN: "0/3000060"}
	restoredEv := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: secs(dbNow),
		Note: "0 resurrected session(s) erased again; 3 ledger row(s) found missing or not erased (a restored database) put back in force; " +
			"residue removed: 0 derived record(s), 0 content-keyed entr(ies)",
		Counts: []lethev1.TableCount{{Table: CountContentIndexEntries}, {Table: CountDerivedRecords}, {Table: "erasure ledger rows put back", Rows: 3}}}
	residue := BatchResult{Batch: 6, DerivedRecords: 1, ContentIndexEntries: 2, DeletedAt: dbNow, CommitLSN: "0/3000060"}
	residueEv := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: secs(dbNow),
		Note: "0 resurrected session(s) erased again; 0 ledger row(s) found missing or not erased (a restored database) put back in force; " +
			"residue removed: 1 derived record(s), 2 content-keyed entr(ies)",
		Counts: []lethev1.TableCount{{Table: CountContentIndexEntries, Rows: 2}, {Table: CountDerivedRecords, Rows: 1}, {Table: "erasure ledger rows put back"}}}
	calls := []string{"Ledger.Reerase({req-uid [s1 s2 s3] grace=0s})"}
	runCases(t, reverifyDeletion, map[string]stepCase{
		"NothingBack": {reason: "No erased session came back, and every Resurrected receipt has its entry: done, nothing recorded.",
			er: completed(), fakes: reerase(BatchResult{Skipped: true}, nil),
			want: stepWant{out: Outcome{Kind: Done}, status: after(completed()), calls: append(slices.Clone(calls), resurrectedReceiptsCall)}},
		"NothingErasedAgain": {reason: "A re-erase that erased no session records nothing either.",
			er: completed(), fakes: reerase(BatchResult{Batch: 4}, nil),
			want: stepWant{out: Outcome{Kind: Done}, status: after(completed()), calls: append(slices.Clone(calls), resurrectedReceiptsCall)}},
		"SessionsBack": {reason: "Sessions restored from a backup are erased again, at once: a Resurrected milestone in the request's phase and a Warning; the condition is not touched.",
			er: completed(), fakes: reerase(back, nil),
			want: stepWant{out: Outcome{Kind: Done, Evidence: &ev,
				Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, Event: lethev1.ReasonResurrected, At: dbNow, Evidence: ev, Note: ev.Note},
				Warning:   &Warning{Reason: lethev1.ReasonResurrected, Action: "Erase", Note: "2 erased session(s) reappeared and were erased again; 0 ledger row(s) put back; 0 residue record(s) removed"}},
				status: after(completed(), withEvidence(ev), withEntry(lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, dbNow)), calls: append(slices.Clone(calls), replicaCall)}},
		"LedgerRestored": {reason: "A restored ledger (rows missing, sessions still gone) is a restore too: recorded, so the history says the database went back.",
			er: completed(), fakes: reerase(restored, nil),
			want: stepWant{out: Outcome{Kind: Done, Evidence: &restoredEv,
				Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, Event: lethev1.ReasonResurrected, At: dbNow, Evidence: restoredEv, Note: restoredEv.Note},
				Warning:   &Warning{Reason: lethev1.ReasonResurrected, Action: "Erase", Note: "0 erased session(s) reappeared and were erased again; 3 ledger row(s) put back; 0 residue record(s) removed"}},
				status: after(completed(), withEvidence(restoredEv), withEntry(lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, dbNow)), calls: append(slices.Clone(calls), replicaCall)}},
		"ResidueRemoved": {reason: "Residue written after the deletion (a derived record, a re-cached entry) is removed and recorded like a resurrection.",
			er: completed(), fakes: reerase(residue, nil),
			want: stepWant{out: Outcome{Kind: Done, Evidence: &residueEv,
				Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, Event: lethev1.ReasonResurrected, At: dbNow, Evidence: residueEv, Note: residueEv.Note},
				Warning:   &Warning{Reason: lethev1.ReasonResurrected, Action: "Erase", Note: "0 erased session(s) reappeared and were erased again; 0 ledger row(s) put back; 3 residue record(s) removed"}},
				status: after(completed(), withEvidence(residueEv), withEntry(lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, dbNow)), calls: append(slices.Clone(calls), replicaCall)}},
		"LedgerError": {reason: "A re-erase that failed is an error for a retry; no condition changes.",
			er: completed(), fakes: reerase(BatchResult{}, fmt.Errorf("re-erase: %w", errPort)),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(completed()), calls: calls}},
	})
}

// TestDeletionTextProbeWithoutSample: with no passage sampled the text
// probe is not asked, and the evidence says why: the probe budget is 0,
// nothing long enough was erased, or the batches ran before a manager
// restart (sample not kept).
func TestDeletionTextProbeWithoutSample(t *testing.T) {
	cases := map[string]struct {
		res    DeleteResult
		budget int
		note   string
	}{
		"NoBudget": {res: func() DeleteResult { r := deleteResult(); r.Texts, r.TextRows = nil, 0; return r }(), budget: 0,
			note: "; text probe: none (the probe budget is 0)"},
		"NothingLongEnough": {res: func() DeleteResult { r := deleteResult(); r.Texts = nil; return r }(), budget: 8,
			note: "; text probe: no text of 16 words or more in the 45 deleted row(s), nothing to probe"},
		"AfterRestart": {res: DeleteResult{Batches: []BatchResult{{Batch: 0, Skipped: true}}, CommitLSN: "0/3000060"}, budget: 8,
			note: "; text probe: no sample (the sample is kept in memory only: rows erased before a manager restart, or erased again after a restore, are not sampled)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig
			cfg.ProbeBudget = tc.budget
			run := func(ctx context.Context, s *Scope) Outcome { return (&Deletion{Config: cfg}).Run(ctx, s) }
			got := runFakes(t, run, atDeletion(), deletionFakes(func(f *fakes) {
				f.ledger.DeleteFn = func(context.Context, Request, int, int) (DeleteResult, error) { return tc.res, nil }
				f.ledger.ProbeTextResidueFn = nil // a call fails the test
			}))
			if got.out.Kind != Done {
				t.Fatalf("kind %d, want Done", got.out.Kind)
			}
			if n := got.er.Status.Evidence.Steps[0].Note; !strings.HasSuffix(n, tc.note) {
				t.Errorf("evidence note %q does not end with %q", n, tc.note)
			}
		})
	}
}

// TestDeletionRemovesResidue: a derived record or content-keyed entry that
// outlived the deletion is removed (RemoveResidue) and verified again; the
// step completes with the removal in its note. Residue RemoveResidue
// cannot remove stalls the step like rows left.
func TestDeletionRemovesResidue(t *testing.T) {
	derivedLeft := func(removed BatchResult, verifications *int) func(*fakes) {
		return func(f *fakes) {
			f.ledger.VerifyFn = func(context.Context, Request, ContentKeys) ([]Verification, error) {
				*verifications++
				if *verifications == 1 || removed.Skipped {
					return []Verification{{Check: "sessions of the request"}, {Check: CheckPrefixDerived + "memory_derived.derivations", Found: 1}}, nil
				}
				return []Verification{{Check: "sessions of the request"}, {Check: CheckPrefixDerived + "memory_derived.derivations"}}, nil
			}
			f.ledger.RemoveResidueFn = func(context.Context, Request) (BatchResult, error) { return removed, nil }
		}
	}
	var n int
	got := runFakes(t, runDeletion, atDeletion(), deletionFakes(derivedLeft(BatchResult{Batch: 2, DerivedRecords: 1}, &n)))
	if got.out.Kind != Done || n != 2 {
		t.Fatalf("kind %d after %d verification(s), want Done after the removal and a second verification", got.out.Kind, n)
	}
	if note := got.out.Evidence.Note; !strings.Contains(note, "; residue that outlived the deletion removed (ResidueRemoved receipt 2): 1 derived record(s), 0 content-keyed entr(ies);") {
		t.Errorf("evidence note %q does not record the removal", note)
	}
	if !slices.Contains(got.calls, "Ledger.RemoveResidue({req-uid [s1 s2 s3] grace=0s})") {
		t.Errorf("calls %v: RemoveResidue must get the found sessions", got.calls)
	}

	n = 0
	stuck := runFakes(t, runDeletion, atDeletion(), deletionFakes(derivedLeft(BatchResult{Skipped: true}, &n)))
	if stuck.out.Kind != Stalled || stuck.out.Condition.Reason != lethev1.ReasonVerificationFailed {
		t.Fatalf("residue that could not be removed: kind %d, condition %+v; want Stalled VerificationFailed", stuck.out.Kind, stuck.out.Condition)
	}
}

// TestDeletionReverifyRecordsALostEntry: a re-erasure that committed (its
// Resurrected receipt exists) and whose status write was lost gets its
// history entry on a later pass, from the receipt, once.
func TestDeletionReverifyRecordsALostEntry(t *testing.T) {
	receipts := map[int]StepReceipt{0: {Batch: 0, Sessions: 2, Counts: map[string]int64{"memory.sessions": 2}}}
	f := fakes{ledger: LedgerFns{ReeraseFn: func(context.Context, Request) (BatchResult, error) { return BatchResult{Skipped: true}, nil },
		ReceiptsFn: func(context.Context, string, string) (map[int]StepReceipt, error) { return receipts, nil },
		PositionFn: func(context.Context) (string, error) { return "0/3000060", nil }},
		replicas: func(context.Context, string) (bool, error) { return true, nil }}
	first := runFakes(t, reverifyDeletion, completed(), f)
	if first.out.Milestone == nil || first.out.Milestone.Event != lethev1.ReasonResurrected {
		t.Fatalf("a receipt without its entry: %+v, want a Resurrected milestone", first.out)
	}
	if ev := first.out.Evidence; ev == nil || len(ev.Counts) != 1 || ev.Counts[0].Rows != 2 {
		t.Errorf("evidence %+v, want the receipt's counts", first.out.Evidence)
	}
	again := runFakes(t, reverifyDeletion, first.er, f)
	if again.out.Milestone != nil {
		t.Errorf("the entry was recorded twice: %+v", again.out)
	}
}
