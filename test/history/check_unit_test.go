package history

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// cleanRecord is a synthetic, valid history: request "a" (immediate)
// erases own[0]; request "b" (grace 2s) is cancelled before its claim; the
// graph write names own[0] only.
func cleanRecord() runRecord {
	p := &runPlan{ID: 1, Tenant: "t", GraphKey: "g", Own: []string{sessionID(1, 0), sessionID(1, 1)}, Foreign: sessionID(1, 90), Unknown: sessionID(1, 99),
		Backup: "bk", Decoy: "decoy", DeleteOnImmediate: true,
		Requests: []*plannedRequest{
			{Name: "a", UID: "uid-a", Sessions: []string{sessionID(1, 0), sessionID(1, 90)}, Immediate: true},
			{Name: "b", UID: "uid-b", Sessions: []string{sessionID(1, 1)}, Grace: 2 * time.Second, CancelRV: 50},
		}}
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	ts := func(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }
	s0, s1 := p.Own[0], p.Own[1]
	effects := []dbEffect{
		{Seq: 1, Txid: 10, Table: "memory.sessions", Op: "UPDATE", Old: map[string]any{"id": s0, "tenant_id": "t"}, New: map[string]any{"id": s0, "tenant_id": "t", "tombstoned_by": "uid-a"}},
		{Seq: 2, Txid: 10, Table: "lethe.erasure_ledger", Op: "INSERT", New: map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": s0, "tombstoned_at": ts(0), "grace_ends_at": ts(0)}},
		{Seq: 3, Txid: 10, Table: "lethe.erasure_receipts", Op: "INSERT", New: map[string]any{"request_uid": "uid-a", "step": "Tombstoned", "batch": 0.0}},
		{Seq: 4, Txid: 11, Table: "memory.sessions", Op: "UPDATE", Old: map[string]any{"id": s1, "tenant_id": "t"}, New: map[string]any{"id": s1, "tenant_id": "t", "tombstoned_by": "uid-b"}},
		{Seq: 5, Txid: 11, Table: "lethe.erasure_ledger", Op: "INSERT", New: map[string]any{"scope": "session", "request_uid": "uid-b", "record_id": s1, "tombstoned_at": ts(0), "grace_ends_at": ts(2 * time.Second)}},
		{Seq: 6, Txid: 12, At: t0.Add(time.Second), Table: "memory_derived.derivations", Op: "DELETE", Old: map[string]any{"source_session_id": s0}},
		{Seq: 7, Txid: 12, At: t0.Add(time.Second), Table: "memory.sessions", Op: "DELETE", Old: map[string]any{"id": s0, "tenant_id": "t", "tombstoned_by": "uid-a", "tombstoned_at": ts(0)}},
		{Seq: 8, Txid: 12, Table: "lethe.erasure_ledger", Op: "UPDATE", Old: map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": s0}, New: map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": s0, "erased_at": ts(time.Second)}},
		{Seq: 9, Txid: 12, Table: "lethe.erasure_receipts", Op: "INSERT", New: map[string]any{"request_uid": "uid-a", "step": "Deleted", "batch": 0.0}},
		{Seq: 10, Txid: 13, Table: "lethe.erasure_receipts", Op: "INSERT", New: map[string]any{"request_uid": "uid-a", "step": "GraphReconciled", "batch": 0.0}},
		{Seq: 11, Txid: 14, Table: "lethe.erasure_ledger", Op: "UPDATE", Old: map[string]any{"scope": "session", "request_uid": "uid-b", "record_id": s1}, New: map[string]any{"scope": "session", "request_uid": "uid-b", "record_id": s1, "cancelled_at": ts(time.Second)}},
		{Seq: 12, Txid: 14, Table: "memory.sessions", Op: "UPDATE", Old: map[string]any{"id": s1, "tenant_id": "t", "tombstoned_by": "uid-b"}, New: map[string]any{"id": s1, "tenant_id": "t"}},
	}
	history := func(phases ...lethev1.Phase) []lethev1.HistoryEntry {
		var h []lethev1.HistoryEntry
		for _, ph := range phases {
			h = evidence.Append(h, ph, "", t0, "sha256:0")
		}
		return h
	}
	final := map[string]*lethev1.ErasureRequest{
		"a": {ObjectMeta: metav1.ObjectMeta{UID: "uid-a"}, Status: lethev1.ErasureRequestStatus{Phase: lethev1.PhaseBackupsRotated,
			Plan:    &lethev1.ErasurePlan{SessionsFound: 1},
			History: history(lethev1.PhaseTombstoned, lethev1.PhaseDeleted, lethev1.PhaseGraphReconciled, lethev1.PhaseBackupsRotated)}},
		"b": {ObjectMeta: metav1.ObjectMeta{UID: "uid-b"}, Status: lethev1.ErasureRequestStatus{Phase: lethev1.PhaseCancelled,
			History: history(lethev1.PhaseTombstoned, lethev1.PhaseCancelled)}},
	}
	digests := func(er *lethev1.ErasureRequest, n int) []string {
		var out []string
		for _, h := range er.Status.History[:n] {
			out = append(out, h.Digest)
		}
		return out
	}
	return runRecord{
		Plan:    p,
		Effects: effects,
		Statuses: []statusObs{
			{UID: "uid-a", RV: 20, History: digests(final["a"], 1)},
			{UID: "uid-a", RV: 30, Claimed: true, History: digests(final["a"], 1)},
			{UID: "uid-a", RV: 40, Claimed: true, History: digests(final["a"], 4)},
			{UID: "uid-b", RV: 60, Cancel: true, History: digests(final["b"], 2)},
		},
		Backups: []backupObs{
			{Name: "bk", Expiration: ptrTime(t0.Add(90 * 24 * time.Hour))},
			{Name: "decoy", Expiration: ptrTime(t0.Add(90 * 24 * time.Hour))},
			{Name: "bk", Expiration: ptrTime(t0.Add(time.Second)), Annotations: map[string]string{"erasure.lethe.dev/erased-uid-a": "x"}},
		},
		DBRs:        []dbrObs{{Name: "d1", BackupName: "bk", BackupUID: "bu", ByLethe: true}},
		GraphWrites: []graphWrite{{Key: "g", IDs: []string{s0}}, {Key: "other", IDs: []string{s1}}},
		Final:       final,
		GraphBefore: map[string]int{"Session " + s0: 1, "Session " + s1: 1, "MENTIONS " + s1 + " 2 2>ada": 1, "Entity ada  Ada": 1},
		GraphAfter:  map[string]int{"Session " + s1: 1, "MENTIONS " + s1 + " 2 2>ada": 1, "Entity ada  Ada": 1},
		RowsBefore:  map[string]int64{s0: 9, s1: 9, p.Foreign: 9},
		RowsAfter:   map[string]int64{s0: 0, s1: 9, p.Foreign: 9},
		ReceiptLog:  &receiptLogObs{Origin: receiptlog.Origin("store-uid")},
	}
}

func ptrTime(t time.Time) *time.Time { return &t }

// The checker passes a valid history and reports each planted violation:
// it is the test of the tests, so that a quiet full run means something.
func TestCheckerFindsPlantedViolations(t *testing.T) {
	if v := check(cleanRecord()); len(v) != 0 {
		t.Fatalf("a valid history was reported: %v", v)
	}
	ks, log := signedReceiptLog(t)
	for _, tc := range []struct {
		name  string
		plant func(*runRecord)
		want  string
	}{
		{"deletion before the grace period", func(r *runRecord) {
			r.Plan.Requests[0].Immediate, r.Plan.Requests[0].Grace = false, time.Hour
		}, "ledger's grace period ends"},
		{"deletion of the foreign tenant's session", func(r *runRecord) {
			r.Effects[6].Old["tenant_id"] = "other"
		}, "is not the store's"},
		{"deletion without a ledger mark", func(r *runRecord) {
			r.Effects[7].Txid = 99
		}, "no request of this run marked it erased"},
		{"deletion after the ledger's cancel", func(r *runRecord) {
			r.Effects = append(r.Effects, dbEffect{Seq: 6, Txid: 9, Table: "lethe.erasure_ledger", Op: "UPDATE",
				Old: map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": r.Plan.Own[0]},
				New: map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": r.Plan.Own[0], "cancelled_at": "2026-11-30T01:00:00Z"}})
		}, "had cancelled it in the ledger"},
		{"deletion without a claim", func(r *runRecord) {
			r.Statuses[1].Claimed, r.Statuses[2].Claimed = false, false
		}, "never claimed the deletion"},
		{"claim after an accepted cancel", func(r *runRecord) {
			r.Plan.Requests[1].CancelRV = 10
			r.Statuses = append(r.Statuses, statusObs{UID: "uid-b", RV: 70, Claimed: true, History: r.Statuses[3].History})
		}, "claimed the deletion (rv 70) after its cancel"},
		{"a second receipt for a step", func(r *runRecord) {
			r.Effects = append(r.Effects, r.Effects[8])
		}, "written 2 times"},
		{"a receipt edited", func(r *runRecord) {
			r.Effects = append(r.Effects, dbEffect{Table: "lethe.erasure_receipts", Op: "UPDATE", Old: r.Effects[8].New, New: r.Effects[8].New})
		}, "append-only"},
		{"a derived record deleted outside the erasing transaction", func(r *runRecord) {
			r.Effects[5].Txid = 98
		}, "outside the transaction that erased it"},
		{"an unrequested tombstone lift", func(r *runRecord) {
			r.Plan.Requests[1].CancelRV = 0
		}, "tombstone lifted"},
		{"a request left unfinished", func(r *runRecord) {
			r.Final["a"].Status.Phase = lethev1.PhaseGraphReconciled
		}, "did not complete"},
		{"a history rewritten", func(r *runRecord) {
			r.Statuses[2].History = append([]string{"sha256:other"}, r.Statuses[2].History[1:]...)
		}, "history was rewritten"},
		{"a step twice in the history", func(r *runRecord) {
			h := r.Final["a"].Status.History
			r.Final["a"].Status.History = evidence.Append(h, lethev1.PhaseDeleted, "", time.Now(), "sha256:1")
		}, "2 Deleted entries"},
		{"a kept session's rows changed", func(r *runRecord) {
			r.RowsAfter[r.Plan.Foreign] = 8
		}, "was not erased but has 8 rows"},
		{"rows left after completion", func(r *runRecord) {
			r.RowsAfter[r.Plan.Own[0]] = 1
		}, "rows left after its request completed"},
		{"a graph write naming a kept session", func(r *runRecord) {
			r.GraphWrites[1].Key = "g"
		}, "which was not erased"},
		{"a kept graph element gone", func(r *runRecord) {
			delete(r.GraphAfter, "MENTIONS "+r.Plan.Own[1]+" 2 2>ada")
		}, "none of its sessions was erased"},
		{"an erased session's element left", func(r *runRecord) {
			r.GraphAfter["Session "+r.Plan.Own[0]] = 1
		}, "is still there"},
		{"an orphan entity left", func(r *runRecord) {
			r.GraphAfter["Entity bob  Bob"] = 1
		}, "left with no relationship"},
		{"the decoy Backup annotated", func(r *runRecord) {
			r.Backups = append(r.Backups, backupObs{Name: "decoy", Annotations: map[string]string{"x": "y"}})
		}, "another application's Backup"},
		{"an expiration lengthened", func(r *runRecord) {
			r.Backups = append(r.Backups, backupObs{Name: "bk", Expiration: ptrTime(time.Now().Add(1000 * time.Hour))})
		}, "expiration lengthened"},
		{"two delete requests for one Backup", func(r *runRecord) {
			r.DBRs = append(r.DBRs, dbrObs{Name: "d2", BackupName: "bk", BackupUID: "bu", ByLethe: true})
		}, "2 DeleteBackupRequests"},
		{"a delete request without an immediate erasure", func(r *runRecord) {
			r.Plan.Requests[0].Immediate, r.Plan.Requests[0].Grace = false, 0
		}, "without an immediate erasure"},
		{"a delete request the store does not allow", func(r *runRecord) {
			r.Plan.DeleteOnImmediate = false
		}, "deleteOnImmediate is off"},
		{"a receipt log shortened below a held checkpoint", func(r *runRecord) {
			r.KeySet, r.ReceiptLog = ks, &receiptLogObs{Leaves: log.Leaves[:1], Origin: log.Origin, Held: log.Held}
		}, "does not extend a checkpoint the run's requests hold"},
		{"a held checkpoint no published key opens", func(r *runRecord) {
			r.ReceiptLog = log
		}, "1 of the 1 checkpoints the run's requests hold open with no published key"},
		{"the store's audit says the log is inconsistent", func(r *runRecord) {
			r.ReceiptLog.Condition = &metav1.Condition{Status: metav1.ConditionFalse, Reason: lethev1.ReasonReceiptLogInconsistent}
		}, "ReceiptLogConsistent False"},
		{"no receipt log recorded", func(r *runRecord) {
			r.ReceiptLog = nil
		}, "no receipt log was recorded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := cleanRecord()
			tc.plant(&rec)
			v := check(rec)
			if !strings.Contains(strings.Join(v, "\n"), tc.want) {
				t.Errorf("want a violation containing %q, got %q", tc.want, v)
			}
		})
	}
}

// signedReceiptLog is a log of two receipts and the checkpoint of both,
// signed by the key of ks, as a request would hold it.
func signedReceiptLog(t *testing.T) (evidence.KeySet, *receiptLogObs) {
	t.Helper()
	key, err := evidence.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	ks, _, err := evidence.KeySet{}.WithCurrent(key, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	o := &receiptLogObs{Origin: receiptlog.Origin("store-uid")}
	for _, uid := range []string{"uid-a", "uid-b"} {
		o.Leaves = append(o.Leaves, [32]byte(receiptlog.LeafHash(evidence.LogLeaf(uid, "sha256:0", 1))))
	}
	incl, err := evidence.Include(o.Leaves, 1, "uid-b", "sha256:0", 1, o.Origin, key, ks, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Held = [][]byte{[]byte(incl.Checkpoint)}
	return ks, o
}

// The receipt log check passes a log that extends the held checkpoint,
// and leaves a restore's round alone: a restore takes receipts back by
// design.
func TestReceiptLogCheckPassesAnExtendedLogAndSkipsARestore(t *testing.T) {
	ks, log := signedReceiptLog(t)
	grown := *log
	grown.Leaves = append(grown.Leaves, grown.Leaves[0])
	c := &checker{rec: runRecord{KeySet: ks, ReceiptLog: &grown}}
	c.receiptLog()
	if len(c.v) != 0 {
		t.Fatalf("a log that extends the held checkpoint was reported: %v", c.v)
	}
	shortened := *log
	shortened.Leaves = shortened.Leaves[:1]
	c = &checker{rec: runRecord{KeySet: ks, ReceiptLog: &shortened, Restore: &restoreRecord{}}}
	c.receiptLog()
	if len(c.v) != 0 {
		t.Fatalf("a restore's round was held to the log: %v", c.v)
	}
}
