package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Tombstoned and Deleted each wait until every configured replica has
// replayed past their commit: a replica whose replay is paused holds the
// request at ReplicaLagging — while it still serves the sessions the
// primary hides, and then while it still holds the ones the primary
// deleted — and the request goes on once replay resumes.
func TestDeletedWaitsForTheReplicas(t *testing.T) {
	ctx := context.Background()
	primary := ownMemoryDatabase(t)
	// The manager's login role exists before the replica is cloned (its
	// replay is paused below).
	managerDSN(t, primary.DSN("memory"), true)
	replica, err := primary.StartReplica()
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Stop()
	rconn := connectVector(t, replica.DSN("memory"))
	pauseReplay(t, rconn)

	ns := newNamespace(t, "replica")
	createSecret(t, ns, "pg", map[string]string{"dsn": primary.DSN("memory"), "replica": replica.DSN("memory")})
	store := newStore(ns, func(s *lethev1.MemoryStore) {
		s.Spec.TenantID = "t1"
		s.Spec.Postgres.Replicas = []lethev1.PostgresReplica{{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "replica"}}}
	})
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	env := &memoryEnv{ns: ns, store: store}
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
