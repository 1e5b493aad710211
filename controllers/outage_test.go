package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Postgres goes away during the grace period and comes back: the conditions
// say so, the request resumes on its own, and no effect happens twice (R3).
func TestPostgresOutageIsReportedAndTheRequestResumes(t *testing.T) {
	ctx := context.Background()
	own := ownMemoryDatabase(t)
	dsn := own.DSN("memory")

	ns := newNamespace(t, "outage")
	createSecret(t, ns, "pg", map[string]string{"dsn": dsn + "&connect_timeout=1"})
	store := newStore(ns, func(s *lethev1.MemoryStore) { s.Spec.TenantID = "t1" })
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	env := &memoryEnv{ns: ns, store: store}
	er := env.request(t, "forget-through-outage", func(r *lethev1.ErasureRequest) {
		r.Spec.SessionIDs = []lethev1.SessionID{erasedA}
		r.Spec.Immediate, r.Spec.Reason = false, ""
		r.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	// The grace period ends 2 s into the outage, however late the test
	// got here: the request's next look is an hour away, so nothing reads
	// the new end before the database is down.
	endGraceIn(t, dsn, er, 2*time.Second)

	errorsBefore := reconcileErrors(t)
	own.StopServer()
	nudge(t, er)
	// The request says why it waits.
	c := waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonDatabaseUnavailable)
	if c.Status != metav1.ConditionFalse {
		t.Fatalf("condition during the outage: %+v", c)
	}
	waitCondition(t, store, lethev1.MemoryStorePostgresReady, metav1.ConditionFalse, lethev1.ReasonConnectionFailed)
	time.Sleep(3 * time.Second) // past the grace end, still down

	// Each failed pass went to controller-runtime as an error (retried with
	// backoff and counted), and the condition did not change between them:
	// its message holds no error text.
	if n := reconcileErrors(t) - errorsBefore; n < 2 {
		t.Errorf("controller_runtime_reconcile_errors_total rose by %v during the outage, want at least 2 failed passes", n)
	}
	again := waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonDatabaseUnavailable)
	if again.Message != c.Message || !again.LastTransitionTime.Equal(&c.LastTransitionTime) {
		t.Errorf("the condition changed between failed passes:\n%+v\n%+v", c, again)
	}
	for _, text := range []string{"dial", "connect", "refused", "EOF", "SQLSTATE"} {
		if strings.Contains(c.Message, text) {
			t.Errorf("condition message %q holds error text %q", c.Message, text)
		}
	}

	if err := own.StartServer(); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	conn := connectVector(t, dsn)
	var erased, left, receipts int64
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM memory.sessions WHERE id = $1), (SELECT count(*) FROM memory.sessions)`, erasedA).Scan(&erased, &left); err != nil {
		t.Fatal(err)
	}
	if erased != 0 || left != 1 {
		t.Fatalf("after recovery: erased session rows %d (want 0), sessions left %d (want 1)", erased, left)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1`, string(er.UID)).Scan(&receipts); err != nil {
		t.Fatal(err)
	}
	if receipts != 2 {
		t.Errorf("receipts after the outage: %d, want 2 (Tombstoned, Deleted)", receipts)
	}
}

// reconcileErrors is controller-runtime's count of the ErasureRequest
// controller's failed passes, from the suite manager's registry.
func reconcileErrors(t *testing.T) float64 {
	t.Helper()
	v, found := counterValue(t, "controller_runtime_reconcile_errors_total", "controller", "erasurerequest")
	if !found {
		t.Fatal("no controller_runtime_reconcile_errors_total series for the erasurerequest controller")
	}
	return v
}

// endGraceIn moves the end of er's grace period, by the database's clock,
// to after from now: a test waits out a short grace period without racing
// the request's passes against a window it cannot hold open under load.
func endGraceIn(t *testing.T, dsn string, er *lethev1.ErasureRequest, after time.Duration) {
	t.Helper()
	conn := connectVector(t, dsn)
	tag, err := conn.Exec(context.Background(), `UPDATE lethe.erasure_ledger SET grace_ends_at = now() + make_interval(secs => $2)
		WHERE request_uid = $1 AND cancelled_at IS NULL AND erased_at IS NULL`, string(er.UID), after.Seconds())
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() == 0 {
		t.Fatalf("no ledger row of %s to end the grace period of", er.Name)
	}
}
