package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// Tombstoned and Deleted each wait until every configured replica has
// replayed past their commit: a replica whose replay is paused holds the
// request at ReplicaLagging — while it still serves the sessions the
// primary hides, and then while it still holds the ones the primary
// deleted — and the request goes on once replay resumes.
func TestDeletedWaitsForTheReplicas(t *testing.T) {
	ctx := context.Background()
	primary, replica, env := replicatedStore(t, "replica")
	rconn := connectVector(t, replica.DSN("memory"))
	pauseReplay(t, rconn)
	er := env.request(t, "forget-replicated", func(r *lethev1.ErasureRequest) {
		r.Spec.SessionIDs = []lethev1.SessionID{erasedA}
		r.Spec.Immediate, r.Spec.Reason = false, ""
		r.Spec.GracePeriod = &metav1.Duration{Duration: 10 * time.Second}
	})
	waitStepReason(t, er, lethev1.ConditionTombstoned, lethev1.ReasonReplicaLagging)
	var visible int64
	if err := rconn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions WHERE id = $1 AND tombstoned_at IS NULL`, erasedA).Scan(&visible); err != nil {
		t.Fatal(err)
	}
	if visible != 1 {
		t.Fatalf("the paused replica already has the tombstone: the test cannot see the wait")
	}
	// The grace period starts at the tombstone, so under load it can end
	// while the replica still holds Tombstoned back. A lock on one of the
	// session's rounds, taken before replay resumes, keeps the cascade from
	// committing until replay is paused again, however long that takes (the
	// tombstone, repeated each pass, locks the session, not its rounds).
	pconn := connectVector(t, primary.DSN("memory"))
	hold, err := pconn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(ctx) }()
	var held int64
	if err := hold.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM memory.rounds WHERE session_id = $1 LIMIT 1 FOR UPDATE) r`, erasedA).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 1 {
		t.Fatalf("the session has no round to hold the deletion back with")
	}
	if _, err := rconn.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	waitStepReason(t, er, lethev1.ConditionTombstoned, lethev1.ReasonSessionsTombstoned)
	if err := rconn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions WHERE id = $1 AND tombstoned_at IS NULL`, erasedA).Scan(&visible); err != nil {
		t.Fatal(err)
	}
	if visible != 0 {
		t.Fatalf("Tombstoned is True but the replica still serves the session untombstoned")
	}
	pauseReplay(t, rconn)
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitStepReason(t, er, lethev1.ConditionDeleted, lethev1.ReasonReplicaLagging)
	var onReplica int64
	if err := rconn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions WHERE id = $1`, erasedA).Scan(&onReplica); err != nil {
		t.Fatal(err)
	}
	if onReplica != 1 {
		t.Fatalf("the paused replica already lost the session: the test cannot see the wait")
	}

	if _, err := rconn.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if err := rconn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions WHERE id = $1`, erasedA).Scan(&onReplica); err != nil {
		t.Fatal(err)
	}
	if onReplica != 0 {
		t.Fatalf("Deleted is True but the replica still returns the session")
	}
}

// replicatedStore is a memory database (erasedA and keptB of tenant t1)
// with a streaming replica, and a ready store in a new namespace that names
// both. Both servers stop when the test ends.
func replicatedStore(t *testing.T, prefix string) (primary, replica *testenv.Postgres, env *memoryEnv) {
	t.Helper()
	ctx := context.Background()
	primary = ownMemoryDatabase(t)
	// The manager's login role exists before the replica is cloned.
	managerDSN(t, primary.DSN("memory"), true)
	replica, err := primary.StartReplica()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Stop)
	ns := newNamespace(t, prefix)
	createSecret(t, ns, "pg", map[string]string{"dsn": primary.DSN("memory"), "replica": replica.DSN("memory")})
	store := newStore(ns, func(s *lethev1.MemoryStore) {
		s.Spec.TenantID = "t1"
		s.Spec.Postgres.Replicas = []lethev1.PostgresReplica{{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "replica"}}}
	})
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	return primary, replica, &memoryEnv{ns: ns, store: store}
}

// TestRestoreDuringTheGracePeriodWaitsForTheReplicas: after a restore of a
// dump from before the request, the sessions are tombstoned again on the
// primary, but a replica that has replayed the restore and not the new
// tombstone still serves them. The resurrection is recorded, as the first
// tombstone is, only once every replica has replayed it.
func TestRestoreDuringTheGracePeriodWaitsForTheReplicas(t *testing.T) {
	ctx := context.Background()
	primary, replica, env := replicatedStore(t, "replica-restore")
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := primary.Dump("memory", dump); err != nil {
		t.Fatal(err)
	}
	er := env.request(t, "forget-restored", func(r *lethev1.ErasureRequest) {
		r.Spec.SessionIDs = []lethev1.SessionID{erasedA}
		r.Spec.Immediate, r.Spec.Reason = false, ""
		r.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)

	// The session's lock, taken in the new database before pg_restore fills
	// it, holds the re-tombstone back until the replica has replayed the
	// restore and its replay is paused.
	hold, rcluster := restoreHoldingSession(t, primary, replica, dump, erasedA)
	rconn := connectVector(t, replica.DSN("memory"))
	readable := `SELECT count(*) FROM memory.sessions WHERE id = $1 AND tombstoned_at IS NULL`
	var visible int64
	if err := rconn.QueryRow(ctx, readable, erasedA).Scan(&visible); err != nil || visible != 1 {
		t.Fatalf("the replica serves %d copies of the restored session (%v), want 1: the test cannot see the wait", visible, err)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	nudge(t, er)
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonReplicaLagging)
	if h := historyPhases(er); slices.Contains(h, string(lethev1.PhaseTombstoned)+"/"+lethev1.ReasonResurrected) {
		t.Fatalf("history %v records the re-tombstone while a replica still serves the session", h)
	}
	pconn := connectVector(t, primary.DSN("memory"))
	if err := pconn.QueryRow(ctx, readable, erasedA).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("the primary serves %d copies of the session (%v) at ReplicaLagging: want it tombstoned again", visible, err)
	}
	if err := rconn.QueryRow(ctx, readable, erasedA).Scan(&visible); err != nil || visible != 1 {
		t.Fatalf("the paused replica serves %d copies of the session (%v), want 1: the test cannot see the wait", visible, err)
	}

	if _, err := rcluster.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	waitHistoryEntry(t, er, string(lethev1.PhaseTombstoned)+"/"+lethev1.ReasonResurrected)
	if err := rconn.QueryRow(ctx, readable, erasedA).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("the resurrection is recorded but the replica serves %d copies of the session (%v)", visible, err)
	}
	if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionGracePeriodElapsed); c == nil || c.Status == metav1.ConditionTrue {
		t.Fatalf("GracePeriodElapsed %+v after the re-tombstone: want waiting for the recorded end", c)
	}
	if n := slices.Index(historyPhases(er), string(lethev1.PhaseTombstoned)+"/"+lethev1.ReasonResurrected); n < 0 ||
		slices.Contains(historyPhases(er)[n+1:], string(lethev1.PhaseTombstoned)+"/"+lethev1.ReasonResurrected) {
		t.Errorf("history %v: want exactly one resurrection", historyPhases(er))
	}

	endGraceIn(t, primary.DSN("memory"), er, 0)
	nudge(t, er)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	var onReplica int64
	if err := rconn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions WHERE id = $1`, erasedA).Scan(&onReplica); err != nil || onReplica != 0 {
		t.Fatalf("Deleted is True but the replica still returns the session (%d, %v)", onReplica, err)
	}
	assertNoPersonalData(t, er)
}

// TestADelayedReplicaOnABusyPrimaryIsWaitedFor: a replica that applies
// commits three seconds late (recovery_min_apply_delay) behind a primary
// that commits all the time is always behind the primary's position now.
// The tombstone and the deletion each wait for the position read after
// their own commit, so the request goes on once the replica is three
// seconds past it; a step that read the position anew on each pass would
// wait forever.
func TestADelayedReplicaOnABusyPrimaryIsWaitedFor(t *testing.T) {
	ctx := context.Background()
	primary, replica, env := replicatedStore(t, "replica-busy")
	rcluster := connectPlain(t, replica.DSN("postgres"))
	for _, q := range []string{`ALTER SYSTEM SET recovery_min_apply_delay = '3s'`, `SELECT pg_reload_conf()`} {
		if _, err := rcluster.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pcluster := connectPlain(t, primary.DSN("postgres"))
	if _, err := pcluster.Exec(ctx, `CREATE TABLE churn (at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	churner := connectPlain(t, primary.DSN("postgres")) // a pgx.Conn serves one goroutine
	// The busy primary: a commit every 50 ms until the test ends.
	churnCtx, stop := context.WithCancel(ctx)
	churned := make(chan error, 1)
	go func() {
		var err error
		for churnCtx.Err() == nil && err == nil {
			if _, err = churner.Exec(churnCtx, `INSERT INTO churn VALUES (now())`); err == nil {
				time.Sleep(50 * time.Millisecond)
			}
		}
		churned <- err
	}()
	t.Cleanup(func() {
		stop()
		if err := <-churned; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("the busy primary's writes failed: %v", err)
		}
	})
	// The replica's last replayed commit is more than a second old while
	// the primary commits every 50 ms: the delay is in force.
	lagging := func() {
		t.Helper()
		var behind bool
		if err := rcluster.QueryRow(ctx, `SELECT coalesce(now() - pg_last_xact_replay_timestamp() > interval '1 second', false)`).Scan(&behind); err != nil || !behind {
			t.Fatalf("the replica is not behind the primary (%v): the test cannot see the wait", err)
		}
	}

	er := env.request(t, "forget-delayed", func(r *lethev1.ErasureRequest) {
		r.Spec.SessionIDs = []lethev1.SessionID{erasedA}
		r.Spec.Immediate, r.Spec.Reason = false, ""
		r.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitStepReason(t, er, lethev1.ConditionTombstoned, lethev1.ReasonSessionsTombstoned)
	lagging()
	rconn := connectVector(t, replica.DSN("memory"))
	var visible int64
	if err := rconn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions WHERE id = $1 AND tombstoned_at IS NULL`, erasedA).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("Tombstoned is True but the replica serves the session untombstoned (%d, %v)", visible, err)
	}

	endGraceIn(t, primary.DSN("memory"), er, 0)
	nudge(t, er)
	waitStepReason(t, er, lethev1.ConditionDeleted, lethev1.ReasonSessionsDeleted)
	if err := rconn.QueryRow(ctx, `SELECT count(*) FROM memory.sessions WHERE id = $1`, erasedA).Scan(&visible); err != nil || visible != 0 {
		t.Fatalf("Deleted is True but the replica still returns the session (%d, %v)", visible, err)
	}
	lagging()
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
}

// replayedRestore waits until the replica (rcluster, connected to a
// database the restore did not drop) has replayed everything the primary
// wrote up to now.
func replayedRestore(t *testing.T, primary *testenv.Postgres, rcluster *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	var lsn string
	if err := connectPlain(t, primary.DSN("postgres")).QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		var replayed bool
		if err := rcluster.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&replayed); err != nil {
			return err
		}
		if !replayed {
			return fmt.Errorf("the replica has not replayed the restore (to %s) yet", lsn)
		}
		return nil
	})
}

// connectPlain connects to dsn without pgvector's types (a database without
// the extension); the connection closes when the test ends.
func connectPlain(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	return conn
}

// pauseReplay pauses the replica's replay and waits until it has paused:
// pg_wal_replay_pause only requests it.
func pauseReplay(t *testing.T, rconn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	if _, err := rconn.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		var state string
		if err := rconn.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state); err != nil {
			return err
		}
		if state != "paused" {
			return fmt.Errorf("replay %s, want paused", state)
		}
		return nil
	})
}

// TestRestoreAfterTheDeletionWaitsForTheReplicas: a restore after the
// deletion brings the session back on the primary and, once replayed, on
// the replica. The request erases it again on the primary, and records the
// resurrection only once the replica replayed that too: until then the
// replica still serves the session, and the history must not say it was
// erased again. Deleted stays True; a ReplicaLagging Warning says why the
// entry is not there yet.
func TestRestoreAfterTheDeletionWaitsForTheReplicas(t *testing.T) {
	ctx := context.Background()
	primary, replica, env := replicatedStore(t, "replica-reerase")
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := primary.Dump("memory", dump); err != nil {
		t.Fatal(err)
	}
	er := env.request(t, "forget-then-restored", func(r *lethev1.ErasureRequest) {
		r.Spec.SessionIDs = []lethev1.SessionID{erasedA}
	})
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	resurrected := string(lethev1.PhaseBackupsRotated) + "/" + lethev1.ReasonResurrected

	// The session's lock, taken in the new database before pg_restore fills
	// it, holds the re-erasure back until the replica has replayed the
	// restore and its replay is paused.
	hold, rcluster := restoreHoldingSession(t, primary, replica, dump, erasedA)
	rconn := connectVector(t, replica.DSN("memory"))
	present := `SELECT count(*) FROM memory.sessions WHERE id = $1`
	var n int64
	if err := rconn.QueryRow(ctx, present, erasedA).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the replica holds %d copies of the restored session (%v), want 1: the test cannot see the wait", n, err)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	nudge(t, er)
	eventually(t, 30*time.Second, func() error {
		if requestEvents(t, er, lethev1.ReasonReplicaLagging) == 0 {
			return fmt.Errorf("no ReplicaLagging event on the request yet")
		}
		return nil
	})
	pconn := connectVector(t, primary.DSN("memory"))
	if err := pconn.QueryRow(ctx, present, erasedA).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the primary holds %d copies of the session (%v) while the re-erasure waits for the replica: want it erased again", n, err)
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(historyPhases(er), resurrected) {
		t.Fatalf("history %v records the re-erasure while the paused replica still serves the session", historyPhases(er))
	}
	if !meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionDeleted) || er.Status.Phase != lethev1.PhaseBackupsRotated {
		t.Errorf("phase %s, Deleted %+v: the wait must not move the request back", er.Status.Phase, meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionDeleted))
	}
	if err := rconn.QueryRow(ctx, present, erasedA).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the paused replica holds %d copies of the session (%v), want 1: the test cannot see the wait", n, err)
	}

	if _, err := rcluster.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	waitHistoryEntry(t, er, resurrected)
	if err := rconn.QueryRow(ctx, present, erasedA).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the re-erasure is recorded but the replica holds %d copies of the session (%v)", n, err)
	}
	if h := historyPhases(er); len(h)-len(slices.DeleteFunc(slices.Clone(h), func(e string) bool { return e == resurrected })) != 1 {
		t.Errorf("history %v: want exactly one resurrection", h)
	}
	assertNoPersonalData(t, er)
}

// restoreHoldingSession restores dump into the primary's memory database
// with the session's lock taken in the new database before pg_restore fills
// it, waits until the replica has replayed the restore, and pauses its
// replay: the lock holds back whatever would erase the session again until
// the caller rolls hold back. rcluster is a connection to the replica.
func restoreHoldingSession(t *testing.T, primary, replica *testenv.Postgres, dump, session string) (hold pgx.Tx, rcluster *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	if err := primary.RestoreWith(ctx, "memory", dump, func() error {
		conn, err := pgx.Connect(ctx, primary.DSN("memory"))
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = conn.Close(ctx) })
		if hold, err = conn.Begin(ctx); err != nil {
			return err
		}
		_, err = hold.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('lethe.session'), hashtext($1))`, session)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rcluster = connectPlain(t, replica.DSN("postgres"))
	replayedRestore(t, primary, rcluster)
	pauseReplay(t, rcluster)
	return hold, rcluster
}
