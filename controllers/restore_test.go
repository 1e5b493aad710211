package controllers_test

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/backups"
	"github.com/lethe-dev/lethe/internal/storerecord"
)

// A restore of the memory database — a real pg_dump taken before, a real
// drop and pg_restore after the erasure — brings the sessions back and takes
// the ledger and the receipts back with them. The request, kept by the API
// server, knows what it found: the sessions are erased again, the ledger
// rows are back in force and the history says so.
func TestRestoredDatabaseIsErasedAgain(t *testing.T) {
	cases := map[string]struct {
		// dumpAt is the phase the dump is taken at.
		dumpAt lethev1.Phase
		mutate func(*lethev1.ErasureRequest)
	}{
		"dump before the request": {dumpAt: ""},
		"dump during the grace period": {dumpAt: lethev1.PhaseTombstoned, mutate: func(er *lethev1.ErasureRequest) {
			er.Spec.Immediate, er.Spec.Reason = false, ""
			er.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newMemoryEnv(t, "restore")
			db := databaseOf(t, e.dsn)
			dump := filepath.Join(t.TempDir(), "memory.dump")
			if tc.dumpAt == "" {
				if err := pg.Dump(db, dump); err != nil {
					t.Fatal(err)
				}
			}
			er := e.request(t, "forget", tc.mutate)
			if tc.dumpAt != "" {
				// The grace period is an hour, so the dump is surely taken
				// inside it; then it ends by the database's clock.
				waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
				if err := pg.Dump(db, dump); err != nil {
					t.Fatal(err)
				}
				endGraceIn(t, e.dsn, er, 0)
				nudge(t, er)
			}
			waitPhase(t, er, lethev1.PhaseBackupsRotated)
			assertRestoreErasedAgain(t, e, er, db, dump)
		})
	}
}

// A restore during the grace period of a dump taken before the request
// takes the tombstones and the ledger with it: the sessions are readable
// again, nothing refuses a derivation from them, and the database no longer
// knows the grace period's end. The request tombstones them again, their
// grace period ending at the end it recorded (the undo holds until then),
// and erases them once it passes; an empty ledger is not read as a grace
// period served.
func TestRestoreDuringTheGracePeriodTombstonesAgain(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "restore-grace")
	db := databaseOf(t, e.dsn)
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, dump); err != nil {
		t.Fatal(err)
	}
	keptBefore := e.sessionRows(t, keptB)
	er := e.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	recordedEnd := er.Status.GraceEndsAt
	if err := pg.Restore(ctx, db, dump); err != nil {
		t.Fatal(err)
	}
	conn := connectVector(t, e.dsn)
	e.conn = conn // the restore ended the environment's connection
	readable := `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[]) AND tombstoned_at IS NULL`
	if n := e.count(t, readable, []string{erasedA, erasedA2}); n != 2 || recordedEnd == nil ||
		e.count(t, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1`, string(er.UID)) != 0 {
		t.Fatalf("after the restore: %d requested sessions readable (want 2), graceEndsAt %v: the restore did not take the tombstones and the ledger", n, recordedEnd)
	}

	nudge(t, er)
	eventually(t, 30*time.Second, func() error {
		if n := e.count(t, readable, []string{erasedA, erasedA2}); n != 0 {
			return fmt.Errorf("%d requested sessions readable after the restore: want them tombstoned again", n)
		}
		return nil
	})
	// In force to the recorded end, not a whole grace period again.
	var guarded int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session'
		AND erased_at IS NULL AND cancelled_at IS NULL AND grace_ends_at BETWEEN $2 AND $2 + interval '1 minute'`,
		string(er.UID), recordedEnd.Time).Scan(&guarded); err != nil || guarded != 2 {
		t.Errorf("%d ledger rows of the request in force until the recorded end (%v), want 2", guarded, err)
	}
	for _, id := range []string{erasedA, erasedA2} {
		if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = $1`, id); n != 1 {
			t.Fatalf("session %s erased inside the grace period the request recorded", id)
		}
	}
	// The signed history says so (the pass writes it after the tombstone commits).
	waitHistoryEntry(t, er, string(lethev1.PhaseTombstoned)+"/"+lethev1.ReasonResurrected)
	if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionGracePeriodElapsed); c == nil || c.Status == metav1.ConditionTrue {
		t.Fatalf("GracePeriodElapsed %+v after the restore: want still waiting for the recorded end", c)
	}

	endGraceIn(t, e.dsn, er, 0)
	nudge(t, er)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	for _, id := range []string{erasedA, erasedA2} {
		if n := e.sessionRows(t, id); n != 0 {
			t.Errorf("%d rows of session %s remain", n, id)
		}
		var erased bool
		if err := conn.QueryRow(ctx, `SELECT lethe.is_erased('session', $1)`, id).Scan(&erased); err != nil || !erased {
			t.Errorf("session %s: the ledger does not hold it erased (%v)", id, err)
		}
	}
	if n := e.sessionRows(t, keptB); n != keptBefore {
		t.Errorf("kept session: %d rows, want %d", n, keptBefore)
	}
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = $1`, otherT2); n != 1 {
		t.Errorf("the other tenant's session is gone")
	}
	// The history with its resurrection signs, and the database's chain check takes it.
	assertSignedReceipt(t, er)
	eventually(t, 30*time.Second, func() error {
		if n := e.count(t, `SELECT count(*) FROM lethe.erasure_proofs WHERE request_uid = $1`, string(er.UID)); n != 1 {
			return fmt.Errorf("%d proofs of the request mirrored, want 1", n)
		}
		return nil
	})
	assertNoPersonalData(t, er)
}

// assertRestoreErasedAgain restores dump over db and checks the request
// erases what came back.
func assertRestoreErasedAgain(t *testing.T, e *memoryEnv, er *lethev1.ErasureRequest, db, dump string) {
	t.Helper()
	ctx := context.Background()
	keptBefore := e.sessionRows(t, keptB)
	// The sessions coming back is in the Resurrected evidence below: a pass
	// may erase them again before the test could look.
	restoreDump(t, e, db, dump)
	conn := e.conn
	waitHistoryEntry(t, er, string(lethev1.PhaseBackupsRotated)+"/"+lethev1.ReasonResurrected)

	for _, id := range []string{erasedA, erasedA2} {
		if n := e.sessionRows(t, id); n != 0 {
			t.Errorf("%d rows of session %s remain after the re-erasure", n, id)
		}
		var erased bool
		if err := conn.QueryRow(ctx, `SELECT lethe.is_erased('session', $1)`, id).Scan(&erased); err != nil || !erased {
			t.Errorf("session %s: the ledger does not hold it erased again (%v)", id, err)
		}
	}
	if n := e.sessionRows(t, keptB); n != keptBefore {
		t.Errorf("kept session: %d rows, want %d", n, keptBefore)
	}
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = $1`, otherT2); n != 1 {
		t.Errorf("the other tenant's session is gone")
	}
	ev := stepEvidence(t, er, lethev1.ReasonResurrected)
	counts := map[string]int64{}
	for _, c := range ev.Counts {
		counts[c.Table] = c.Rows
	}
	if counts["memory.sessions"] != 2 || counts["erasure ledger rows put back"] != 2 {
		t.Errorf("Resurrected evidence counts %v: want 2 sessions erased again and 2 ledger rows put back", counts)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Resurrected'`, string(er.UID)); n != 1 {
		t.Errorf("%d Resurrected receipts, want 1", n)
	}
	assertNoPersonalData(t, er)
}

// restoreDump restores dump over the database db of e, renews e's
// connection (the restore ended it) and checks that the restore happened:
// a table made before it, which the dump does not hold, is gone.
func restoreDump(t *testing.T, e *memoryEnv, db, dump string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.conn.Exec(ctx, `CREATE TABLE public.lethe_test_not_in_the_dump ()`); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restore(ctx, db, dump); err != nil {
		t.Fatal(err)
	}
	e.conn = connectVector(t, e.dsn)
	var restored bool
	if err := e.conn.QueryRow(ctx, `SELECT to_regclass('public.lethe_test_not_in_the_dump') IS NULL`).Scan(&restored); err != nil || !restored {
		t.Fatalf("the table created after the dump is still there (%v): the restore did not happen", err)
	}
}

// dumpThenErase dumps the database of e, then has a request erase sessions
// A and A2 and complete: the dump holds what it erased.
func dumpThenErase(t *testing.T, e *memoryEnv) (db, dump string, er *lethev1.ErasureRequest) {
	t.Helper()
	db = databaseOf(t, e.dsn)
	dump = filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, dump); err != nil {
		t.Fatal(err)
	}
	er = e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	return db, dump, er
}

// databaseOf is the database name of a DSN.
func databaseOf(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// A session the deletion skipped (here its tenant changed during the grace
// period, so the guard no longer lets it be deleted) is found by the
// verification — it checks what the request found, not what the ledger says
// was erased — and Deleted is not done.
func TestSessionSkippedByTheDeletionIsNotVerifiedAbsent(t *testing.T) {
	e := newMemoryEnv(t, "skipped")
	er := e.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	if _, err := e.conn.Exec(context.Background(), `UPDATE memory.sessions SET tenant_id = 't9' WHERE id = $1`, erasedA); err != nil {
		t.Fatal(err)
	}
	endGraceIn(t, e.dsn, er, 0)
	nudge(t, er)
	c := waitStepReason(t, er, lethev1.ConditionDeleted, lethev1.ReasonVerificationFailed)
	for _, want := range []string{"rows of the sessions in memory.sessions", "requested sessions the ledger does not record as erased"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Deleted message %q does not name %q", c.Message, want)
		}
	}
	if n := e.sessionRows(t, erasedA2); n != 0 {
		t.Errorf("the other requested session was not deleted: %d rows", n)
	}
}

// The MemoryStore's audit compares the requests with the database on its
// own interval: with the requests' own passes stopped, a restore shows as
// ErasuresIntact=False (RestoreDetected) with a Warning event; once the
// passes resume, the audit's nudge has the request erase again and the
// condition comes back.
func TestStoreAuditDetectsARestore(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "restore-audit")
	db, dump, er := dumpThenErase(t, e)
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)

	pausedNamespaces.Store(e.ns, true)
	t.Cleanup(func() { pausedNamespaces.Delete(e.ns) })
	if err := pg.Restore(ctx, db, dump); err != nil {
		t.Fatal(err)
	}
	e.conn = connectVector(t, e.dsn)
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionFalse, lethev1.ReasonRestoreDetected)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, []string{erasedA, erasedA2}); n != 2 {
		t.Fatalf("%d restored sessions present while the requests are paused, want 2: the audit must have seen the restore itself", n)
	}
	eventually(t, 10*time.Second, func() error {
		if n := storeEvents(t, e.store, lethev1.ReasonRestoreDetected); n != 1 {
			return fmt.Errorf("%d RestoreDetected events on the store, want 1", n)
		}
		return nil
	})
	// Counted by the same audit after its re-erasure: wait for it.
	eventually(t, 10*time.Second, func() error {
		if n := restoresDetected(t, e.ns); n != 1 {
			return fmt.Errorf("lethe_memorystore_restores_detected_total for the store: %v, want 1", n)
		}
		return nil
	})

	pausedNamespaces.Delete(e.ns)
	waitHistoryEntry(t, er, string(lethev1.PhaseBackupsRotated)+"/"+lethev1.ReasonResurrected)
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, []string{erasedA, erasedA2}); n != 0 {
		t.Errorf("%d restored sessions remain after the re-erasure", n)
	}
}

// storeEvents counts the events with reason on the store.
func storeEvents(t *testing.T, store *lethev1.MemoryStore, reason string) int {
	t.Helper()
	evs := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), evs, client.InNamespace(store.Namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs.Items {
		if ev.Regarding.Kind == "MemoryStore" && ev.Regarding.Name == store.Name && ev.Reason == reason {
			n++
		}
	}
	return n
}

// restoresDetected is the store audit's restore counter for namespace ns.
func restoresDetected(t *testing.T, ns string) float64 {
	t.Helper()
	v, _ := counterValue(t, "lethe_memorystore_restores_detected_total", "namespace", ns)
	return v
}

// A manager that dies after the deletion committed and before its status
// write leaves the evidence to a later pass, whose batches are all done
// already: the evidence counts them from their receipts, not as "0 deleted".
func TestEvidenceCountsTheBatchesAnEarlierPassRan(t *testing.T) {
	e := newMemoryEnv(t, "evidence-after-crash")
	var crashed atomic.Bool
	restore := setCrashHook(func(ns, point string) bool {
		return ns == e.ns && point == "after-delete-commit" && crashed.CompareAndSwap(false, true)
	})
	t.Cleanup(restore)
	er := e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if !crashed.Load() {
		t.Fatal("no crash was injected after the deletion's commit")
	}
	ev := stepEvidence(t, er, lethev1.ConditionDeleted)
	counts := map[string]int64{}
	for _, c := range ev.Counts {
		counts[c.Table] = c.Rows
	}
	if counts["memory.sessions"] != 2 || counts["memory.rounds"] == 0 || !strings.HasPrefix(ev.Note, "2 session(s) deleted in 1 batch(es)") {
		t.Errorf("Deleted evidence after a crash: counts %v, note %q; want the 2 sessions the crashed pass deleted", counts, ev.Note)
	}
	// The crashed pass's sample was lost with it: the evidence says how many
	// embeddings were probed, and that the budget was not met.
	if !strings.Contains(ev.Note, "residue probe: 0 of ") || !strings.Contains(ev.Note, "fewer than the budget") {
		t.Errorf("Deleted evidence note %q does not say the residue probe had no sample", ev.Note)
	}
}

// A restore between the deletion and the end of the backup step (a Backup
// still expiring holds the request there): the deletion's own check on the
// next pass erases again, so the backup step works from a ledger back in
// force — its deletion time is the re-erasure's, not "nothing was erased".
func TestRestoreBeforeTheBackupsAreGoneIsErasedAgain(t *testing.T) {
	ctx := context.Background()
	ve := newVeleroEnv(t, "restore-backups")
	db := databaseOf(t, ve.dsn)
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, dump); err != nil {
		t.Fatal(err)
	}
	nightly := ve.backup(t, "nightly", ve.app, 90*day) // expires after the deadline: shortened
	er := ve.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Millisecond}
	})
	waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	firstDeletion := ve.deletedAt(t, er)
	if b := ve.get(t, "nightly"); !b.Status.Expiration.Before(nightly.Status.Expiration) || backups.ReadSummary(b.Annotations).Count != 1 {
		t.Fatalf("the Backup was not rotated: expiration %s (Velero set %s), annotations %v", b.Status.Expiration, nightly.Status.Expiration, b.Annotations)
	}

	if err := pg.Restore(ctx, db, dump); err != nil {
		t.Fatal(err)
	}
	ve.conn = connectVector(t, ve.dsn)
	waitHistoryEntry(t, er, string(lethev1.PhaseGraphReconciled)+"/"+lethev1.ReasonResurrected)
	for _, id := range []string{erasedA, erasedA2} {
		if n := ve.sessionRows(t, id); n != 0 {
			t.Errorf("%d rows of session %s remain after the re-erasure", n, id)
		}
	}
	if again := ve.deletedAt(t, er); !again.After(firstDeletion) {
		t.Errorf("the ledger's deletion time %s is not the re-erasure's (first deletion %s)", again, firstDeletion)
	}
	ve.deleteWithVelero(t, "nightly")
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionBackupsRotated); c == nil || c.Reason != lethev1.ReasonBackupsGone {
		t.Errorf("BackupsRotated %+v, want BackupsGone (the step must not conclude nothing was erased)", c)
	}
}

// A completed request deleted (a GitOps prune, a namespace clean-up) leaves
// the store's record behind, in the API server: a later restore of the
// database — real pg_dump before, drop and pg_restore after — is found by
// the store audit and erased again from the record alone, the source rows
// are back in force (re-ingestion refused) and the record names no session
// in the clear.
func TestRestoreAfterTheRequestIsDeletedIsErasedAgain(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "restore-gone")
	db, dump, er := dumpThenErase(t, e)
	if err := k8s.Delete(ctx, er); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), &lethev1.ErasureRequest{}); err == nil {
			return fmt.Errorf("request still exists")
		} else {
			return client.IgnoreNotFound(err)
		}
	})
	assertRecordKeepsNoIDs(t, e, string(er.UID))
	// The counter counts a store going from intact to not: the audit must
	// have seen it intact first (a quick run restored before it had).
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)

	if err := pg.Restore(ctx, db, dump); err != nil {
		t.Fatal(err)
	}
	e.conn = connectVector(t, e.dsn)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, []string{erasedA, erasedA2}); n != 2 {
		t.Fatalf("%d erased sessions back after the restore, want 2: the restore did not happen", n)
	}
	eventually(t, 30*time.Second, func() error {
		if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, []string{erasedA, erasedA2}); n != 0 {
			return fmt.Errorf("%d restored sessions of the deleted request remain", n)
		}
		return nil
	})
	for _, id := range []string{erasedA, erasedA2} {
		if n := e.sessionRows(t, id); n != 0 {
			t.Errorf("%d rows of session %s remain after the re-erasure", n, id)
		}
	}
	if n := e.sessionRows(t, keptB); n == 0 {
		t.Error("the kept session went with the re-erasure")
	}
	// The event follows the re-erasure's commit, through the recorder's
	// own queue: wait for it.
	eventually(t, 10*time.Second, func() error {
		if n := storeEvents(t, e.store, lethev1.ReasonResurrected); n < 1 {
			return fmt.Errorf("%d Resurrected events on the store, want at least 1", n)
		}
		return nil
	})
	// Counted by the same audit after its re-erasure: wait for it.
	eventually(t, 10*time.Second, func() error {
		if n := restoresDetected(t, e.ns); n != 1 {
			return fmt.Errorf("lethe_memorystore_restores_detected_total for the store: %v, want 1", n)
		}
		return nil
	})
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)
	// The transcript files stay on disk: their re-ingestion is refused again.
	if err := ingestErased(ctx, e.conn); !strings.Contains(fmt.Sprint(err), "LE002") {
		t.Errorf("re-ingesting an erased transcript after the restore: %v, want SQLSTATE LE002", err)
	}
}

// assertRecordKeepsNoIDs checks that the store's record holds the request
// and names none of its sessions in the clear.
func assertRecordKeepsNoIDs(t *testing.T, e *memoryEnv, uid string) {
	t.Helper()
	cms := &corev1.ConfigMapList{}
	if err := k8s.List(context.Background(), cms, client.InNamespace(e.ns), client.MatchingLabels{storerecord.LabelStore: e.store.Name}); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, cm := range cms.Items {
		for k, v := range cm.Data {
			found = found || k == uid
			for _, id := range []string{erasedA, erasedA2} {
				if strings.Contains(v, id) {
					t.Errorf("the store's record names session %s in the clear", id)
				}
			}
		}
	}
	if !found {
		t.Fatalf("the store's record (%d ConfigMap(s)) has no entry for the deleted request", len(cms.Items))
	}
}
