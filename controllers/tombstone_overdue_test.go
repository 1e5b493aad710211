package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A tombstone whose grace has passed and whose deletion cannot run (here the
// store's schema stopped being compliant after the request tombstoned)
// shows in lethe_tombstone_overdue_seconds, which the alert
// LetheTombstoneOutlivedGrace watches; once the deletion runs it goes to 0.
func TestOverdueTombstonesShowInTheGauge(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "overdue")
	er := e.requestWaitingForACompliantSchema(t, "forget")
	eventually(t, 30*time.Second, func() error {
		if v := gaugeValue(t, "lethe_tombstone_overdue_seconds", "namespace", e.ns); v <= 0 {
			return fmt.Errorf("lethe_tombstone_overdue_seconds = %v, want > 0 while the deletion cannot run", v)
		}
		return nil
	})
	// Fixed as the reference tables are wired: a cascading key, forced
	// row-level security, the application's policy and Lethe's.
	if _, err := e.conn.Exec(ctx, `ALTER TABLE memory.session_notes DROP CONSTRAINT session_notes_session_id_fkey,
		ADD FOREIGN KEY (session_id) REFERENCES memory.sessions (id) ON DELETE CASCADE,
		ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
		CREATE POLICY app_live_session_rows ON memory.session_notes TO memory_app, memory_owner
			USING (EXISTS (SELECT 1 FROM memory.sessions s WHERE s.id = session_id));
		CREATE POLICY lethe_operator_all ON memory.session_notes TO lethe_operator USING (true) WITH CHECK (true)`); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	eventually(t, 30*time.Second, func() error {
		if v := gaugeValue(t, "lethe_tombstone_overdue_seconds", "namespace", e.ns); v != 0 {
			return fmt.Errorf("lethe_tombstone_overdue_seconds = %v after the deletion, want 0", v)
		}
		return nil
	})
}

// requestWaitingForACompliantSchema makes e's store non-compliant (a table
// holding session rows without a cascading key), then applies a request
// with a 1 ms grace period and waits until its deletion, never claimed,
// waits with StoreNotReady. DROP TABLE memory.session_notes fixes it.
func (e *memoryEnv) requestWaitingForACompliantSchema(t *testing.T, name string) *lethev1.ErasureRequest {
	t.Helper()
	if _, err := e.conn.Exec(context.Background(), `CREATE TABLE memory.session_notes (
		id bigint PRIMARY KEY, session_id uuid NOT NULL REFERENCES memory.sessions (id), note text);
		GRANT SELECT ON memory.session_notes TO lethe_operator`); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreSchemaCompliant, metav1.ConditionFalse, lethev1.ReasonViolationsFound)
	er := e.request(t, name, func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Millisecond}
	})
	waitStepReason(t, er, lethev1.ConditionDeleted, lethev1.ReasonStoreNotReady)
	return er
}
