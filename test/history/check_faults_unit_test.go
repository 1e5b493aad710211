package history

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// faultRecord is cleanRecord with the faults of this file: the sources'
// ledger rows (written with the tombstones, b's cancelled with its
// session's), re-ingestion attempts before and after the erasures, and a
// restore after which request "a" erased own[0] again.
func faultRecord() runRecord {
	rec := cleanRecord()
	s0, s1 := rec.Plan.Own[0], rec.Plan.Own[1]
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	ts := func(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }
	source := func(uid, hash string) map[string]any {
		return map[string]any{"scope": "source", "request_uid": uid, "record_id": hash}
	}
	cancelled := source("uid-b", "h1")
	cancelled["cancelled_at"] = ts(time.Second)
	rec.Effects = append(rec.Effects,
		dbEffect{Seq: 13, Txid: 10, Table: "lethe.erasure_ledger", Op: "INSERT", New: source("uid-a", "h0")},
		dbEffect{Seq: 14, Txid: 11, Table: "lethe.erasure_ledger", Op: "INSERT", New: source("uid-b", "h1")},
		dbEffect{Seq: 15, Txid: 14, Table: "lethe.erasure_ledger", Op: "UPDATE", Old: source("uid-b", "h1"), New: cancelled})
	rec.Statuses[2].Phase = lethev1.PhaseBackupsRotated
	rec.Statuses[3].Phase = lethev1.PhaseCancelled
	snap := func(xmin, xmax uint64, xip ...uint64) pgSnapshot { return pgSnapshot{xmin: xmin, xmax: xmax, xip: xip} }
	rec.Reingestions = []reingestion{
		{Session: s0, Hash: "h0", Snapshot: snap(10, 10)},                     // before a's tombstone
		{Session: s0, Hash: "h0", Snapshot: snap(10, 12, 10), Refused: false}, // a's tombstone in progress
		{Session: s1, Hash: "h1", Snapshot: snap(12, 12), Refused: true},      // b's tombstone, not yet cancelled
		{Session: s0, Hash: "h0", Snapshot: snap(20, 20), Refused: true, Final: true},
		{Session: s1, Hash: "h1", Snapshot: snap(20, 20), Final: true},
	}

	// The restore: the dump held no ledger row; a erases own[0] again.
	at := map[string]*lethev1.ErasureRequest{}
	for name, er := range rec.Final {
		at[name] = er.DeepCopy()
	}
	at["a"].Status.Conditions = []metav1.Condition{{Type: lethev1.ConditionDeleted, Status: metav1.ConditionTrue}}
	erased := map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": s0, "erased_at": ts(time.Minute)}
	rec.Restore = &restoreRecord{AtRestore: at, EffectsAfter: []dbEffect{
		{Seq: 1, Txid: 30, Table: "lethe.erasure_ledger", Op: "INSERT", New: map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": s0}},
		{Seq: 2, Txid: 30, Table: "lethe.erasure_ledger", Op: "INSERT", New: source("uid-a", "h0")},
		{Seq: 3, Txid: 30, Table: "memory.sessions", Op: "UPDATE", Old: map[string]any{"id": s0, "tenant_id": "t"}, New: map[string]any{"id": s0, "tenant_id": "t", "tombstoned_by": "uid-a"}},
		{Seq: 4, Txid: 30, Table: "memory_derived.derivations", Op: "DELETE", Old: map[string]any{"source_session_id": s0}},
		{Seq: 5, Txid: 30, Table: "memory.sessions", Op: "DELETE", Old: map[string]any{"id": s0, "tenant_id": "t", "tombstoned_by": "uid-a"}},
		{Seq: 6, Txid: 30, Table: "lethe.erasure_ledger", Op: "UPDATE", Old: map[string]any{"scope": "session", "request_uid": "uid-a", "record_id": s0}, New: erased},
		{Seq: 7, Txid: 30, Table: "lethe.erasure_receipts", Op: "INSERT", New: map[string]any{"request_uid": "uid-a", "step": "Resurrected", "batch": 0.0}},
	}}
	rec.Final["a"].Status.History = evidence.Append(rec.Final["a"].Status.History, lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, t0.Add(time.Minute), "sha256:2")
	rec.Reingestions = append(rec.Reingestions,
		reingestion{Session: s0, Hash: "h0", Snapshot: snap(25, 25), AfterRestore: true},                             // before the re-erasure
		reingestion{Session: s0, Hash: "h0", Snapshot: snap(31, 31), AfterRestore: true, Refused: true, Final: true}) // after it
	return rec
}

// The restore and re-ingestion checks pass a valid history and report each
// planted violation.
func TestCheckerFindsPlantedFaultViolations(t *testing.T) {
	if v := check(faultRecord()); len(v) != 0 {
		t.Fatalf("a valid history was reported: %v", v)
	}
	for _, tc := range []struct {
		name  string
		plant func(*runRecord)
		want  string
	}{
		{"a refusal no ledger row explains", func(r *runRecord) {
			r.Reingestions[0].Refused = true
		}, "was refused, though no ledger row in force"},
		{"an acceptance despite the ledger", func(r *runRecord) {
			r.Reingestions[2].Refused = false
		}, "was accepted, though a ledger row in force"},
		{"a transaction in progress taken as committed", func(r *runRecord) {
			r.Reingestions[1].Snapshot.xip = nil
		}, "was accepted, though a ledger row in force"},
		{"a cancelled source still refused", func(r *runRecord) {
			r.Reingestions[4].Refused = true
		}, "was refused, though no ledger row in force"},
		{"a session held without its source", func(r *runRecord) {
			r.Effects[12].Table = "elsewhere"
			r.Reingestions[3].Refused = false
		}, "held the session erased but not its source"},
		{"an erased session's transcript accepted at the end", func(r *runRecord) {
			r.Restore.EffectsAfter[1].Table = "elsewhere"
			r.Restore.EffectsAfter[0].Table = "elsewhere"
			r.Restore.EffectsAfter[5].Table = "elsewhere"
			r.Reingestions[6].Refused = false
		}, "was accepted, though the session was erased"},
		{"a phase going back", func(r *runRecord) {
			r.Statuses = append(r.Statuses, statusObs{UID: "uid-a", RV: 80, Phase: lethev1.PhaseDeleted, History: r.Statuses[2].History})
		}, "went from BackupsRotated back"},
		{"a phase changed by the restore", func(r *runRecord) {
			r.Final["a"].Status.Phase = lethev1.PhaseGraphReconciled
		}, "at the restore and is GraphReconciled"},
		{"no Resurrected entry", func(r *runRecord) {
			r.Final["a"].Status.History = r.Restore.AtRestore["a"].Status.History
		}, "no Resurrected entry after the restore"},
		{"a deletion after the restore by a request that had not erased it", func(r *runRecord) {
			r.Restore.EffectsAfter[5].New["request_uid"] = "uid-b"
			r.Plan.Requests[1].Sessions = append(r.Plan.Requests[1].Sessions, r.Plan.Own[0])
		}, "had not erased it before the restore"},
		{"a deletion after the restore without a ledger mark", func(r *runRecord) {
			r.Restore.EffectsAfter[5].Txid = 31
		}, "outside a valid re-erasure: no request of this run marked it"},
		{"a derived record deleted apart from its source after the restore", func(r *runRecord) {
			r.Restore.EffectsAfter[3].Txid = 29
		}, "outside the transaction that erased it again"},
		{"a step receipt after the restore", func(r *runRecord) {
			r.Restore.EffectsAfter[6].New["step"] = "Deleted"
		}, "only a re-erasure (Resurrected) is due"},
		{"a Resurrected receipt twice", func(r *runRecord) {
			r.Restore.EffectsAfter = append(r.Restore.EffectsAfter, r.Restore.EffectsAfter[6])
		}, "written 2 times after the restore"},
		{"a tombstone lifted after the restore", func(r *runRecord) {
			r.Restore.EffectsAfter = append(r.Restore.EffectsAfter, dbEffect{Table: "memory.sessions", Op: "UPDATE",
				Old: map[string]any{"id": r.Plan.Own[1], "tenant_id": "t", "tombstoned_by": "uid-b"}, New: map[string]any{"id": r.Plan.Own[1], "tenant_id": "t"}})
		}, "tombstone lifted after the restore"},
		{"a session brought back after the restore", func(r *runRecord) {
			r.Restore.EffectsAfter = append(r.Restore.EffectsAfter, dbEffect{Table: "memory.sessions", Op: "INSERT", New: map[string]any{"id": r.Plan.Own[0]}})
		}, "inserted after the restore"},
		{"the erasures not holding within the bound", func(r *runRecord) {
			r.Restore.Findings = []string{"the erasures did not hold again within 2m0s of the restore"}
		}, "did not hold again"},
		{"a tombstone left after every request ended", func(r *runRecord) {
			r.TombstonedAfter = map[string]string{r.Plan.Own[1]: "uid-b"}
		}, "still tombstoned by request b (Cancelled)"},
		{"a cancelled request's ledger rows left in force", func(r *runRecord) {
			r.InForceAfter = map[string]int64{"uid-a": 3, "uid-b": 3}
		}, "request b ended Cancelled, but 3 of its ledger rows are not cancelled"},
		{"cache entries of erased content left", func(r *runRecord) {
			r.CacheBefore = map[string]int64{r.Plan.Own[0]: 3, r.Plan.Own[1]: 3, r.Plan.Foreign: 3}
			r.CacheAfter = map[string]int64{r.Plan.Own[0]: 1, r.Plan.Own[1]: 3, r.Plan.Foreign: 3}
		}, "cache entries of its content left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := faultRecord()
			tc.plant(&rec)
			v := check(rec)
			if !strings.Contains(strings.Join(v, "\n"), tc.want) {
				t.Errorf("want a violation containing %q, got %q", tc.want, v)
			}
		})
	}
}

func TestSnapshotVisibility(t *testing.T) {
	s, err := parseSnapshot("100:105:101,103")
	if err != nil {
		t.Fatal(err)
	}
	for txid, want := range map[int64]bool{99: true, 100: true, 101: false, 102: true, 103: false, 104: true, 105: false, 200: false} {
		if got := s.visible(txid); got != want {
			t.Errorf("visible(%d) = %v, want %v", txid, got, want)
		}
	}
}
