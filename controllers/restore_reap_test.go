package controllers_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A request erased and then deleted; the database is restored (a real
// pg_dump taken in its grace period, a real pg_restore) to a state where
// its sessions are tombstoned with its ledger rows in force, and where the
// store's audit cannot erase them again yet (a table holding session rows
// without a cascading key, in the dump too). The reaper sees tombstones of
// a gone request whose deletion never started: it must not lift them, the
// store's record says the request was erased. Once the schema is fixed the
// audit erases them again.
func TestReaperLeavesARestoredErasureToTheRecord(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "restore-reap")
	db := databaseOf(t, e.dsn)
	er := e.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	uid := string(er.UID)

	const uncascaded = `CREATE TABLE memory.session_notes (
		id bigint PRIMARY KEY, session_id uuid NOT NULL REFERENCES memory.sessions (id), note text);
		GRANT SELECT ON memory.session_notes TO lethe_operator`
	if _, err := e.conn.Exec(ctx, uncascaded); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, dump); err != nil {
		t.Fatal(err)
	}
	if _, err := e.conn.Exec(ctx, `DROP TABLE memory.session_notes`); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreSchemaCompliant, metav1.ConditionTrue, lethev1.ReasonCompliant)
	endGraceIn(t, e.dsn, er, 0)
	nudge(t, er)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	deleteAndWaitGone(t, er)
	if !recorded(t, e, uid) {
		t.Fatal("the deleted request is not in the store's record: the case this test is about did not happen")
	}

	if err := pg.Restore(ctx, db, dump); err != nil {
		t.Fatal(err)
	}
	e.conn = connectVector(t, e.dsn)
	hidden := `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[]) AND tombstoned_at IS NOT NULL`
	inForce := `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session'
		AND erased_at IS NULL AND cancelled_at IS NULL`
	if n, m := e.count(t, hidden, []string{erasedA, erasedA2}), e.count(t, inForce, uid); n != 2 || m != 2 {
		t.Fatalf("after the restore: %d sessions tombstoned, %d ledger rows in force, want 2 and 2: the restore did not happen", n, m)
	}
	// The status patch follows the reaper in the same audit: once the store
	// reads non-compliant, an audit of the restored database has reaped.
	waitCondition(t, e.store, lethev1.MemoryStoreSchemaCompliant, metav1.ConditionFalse, lethev1.ReasonViolationsFound)
	if n := e.count(t, hidden, []string{erasedA, erasedA2}); n != 2 {
		t.Errorf("%d of 2 restored sessions of the erased request still tombstoned: the reaper lifted an erasure the store's record holds", n)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Cancelled'`, uid); n != 0 {
		t.Errorf("%d Cancelled receipts for an erased request", n)
	}

	if _, err := e.conn.Exec(ctx, `DROP TABLE memory.session_notes`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, []string{erasedA, erasedA2}); n != 0 {
			return fmt.Errorf("%d restored sessions of the erased request remain once the schema is fixed", n)
		}
		return nil
	})
	for _, id := range []string{erasedA, erasedA2} {
		var erased bool
		if err := e.conn.QueryRow(ctx, `SELECT lethe.is_erased('session', $1)`, id).Scan(&erased); err != nil || !erased {
			t.Errorf("session %s: the ledger does not hold it erased again (%v)", id, err)
		}
	}
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)
}
