package controllers_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

// A request erased and then deleted; the database is restored (a real
// pg_dump taken in its grace period, a real pg_restore) to a state where
// its sessions are tombstoned with its ledger rows in force, and where the
// store's audit cannot erase them again yet (a table holding session rows
// without a cascading key, in the dump too). The reapers of its store and
// of another store on the same database see tombstones of a gone request
// whose deletion never started: they must not lift them, a store's record
// says the request was erased. The store, deleted then,
// waits; once the schema is fixed its audit erases them again and it goes.
func TestReaperLeavesARestoredErasureToTheRecord(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "restore-reap")
	db := databaseOf(t, e.dsn)
	// Another store, in another namespace, on the same database and tenant:
	// its reaper sees the same tombstones, and its own record lacks the
	// request.
	shared := newNamespace(t, "restore-reap-shared")
	createSecret(t, shared, "pg", map[string]string{"dsn": e.dsn})
	other := newStore(shared, func(s *lethev1.MemoryStore) { s.Spec.TenantID = "t1" })
	if err := k8s.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, other, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
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
	// The status patch follows the reaper in the same audit: once each store
	// names a violation made after the restore, an audit of the restored
	// database has reaped.
	if _, err := e.conn.Exec(ctx, `CREATE TABLE memory.session_tags (session_id uuid, tag text)`); err != nil {
		t.Fatal(err)
	}
	for _, store := range []*lethev1.MemoryStore{e.store, other} {
		eventually(t, 30*time.Second, func() error {
			got := &lethev1.MemoryStore{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(store), got); err != nil {
				return err
			}
			if sc := got.Status.Schema; sc == nil || !slices.ContainsFunc(sc.Violations, func(v lethev1.SchemaViolation) bool { return v.Table == "memory.session_tags" }) {
				return fmt.Errorf("the audit of store %s/%s does not name memory.session_tags yet", store.Namespace, store.Name)
			}
			return nil
		})
	}
	if n := e.count(t, hidden, []string{erasedA, erasedA2}); n != 2 {
		t.Errorf("%d of 2 restored sessions of the erased request still tombstoned: the reaper lifted an erasure the store's record holds", n)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Cancelled'`, uid); n != 0 {
		t.Errorf("%d Cancelled receipts for an erased request", n)
	}

	// The store deleted now waits for the re-erasure: its last reap leaves
	// the restored erasure too, and nothing would erase it once it is gone.
	if err := k8s.Delete(ctx, e.store); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if n := storeEvents(t, e.store, controllers.ReasonWaitingForRequests); n == 0 {
			return fmt.Errorf("no %s event: the store did not wait for the re-erasure", controllers.ReasonWaitingForRequests)
		}
		return nil
	})
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(e.store), &lethev1.MemoryStore{}); err != nil {
		t.Fatalf("the store went with a restored erasure not erased again: %v", err)
	}

	if _, err := e.conn.Exec(ctx, `DROP TABLE memory.session_notes; DROP TABLE memory.session_tags`); err != nil {
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
	eventually(t, 30*time.Second, func() error {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(e.store), &lethev1.MemoryStore{})
		if err == nil {
			return fmt.Errorf("the store is still there after the re-erasure")
		}
		return client.IgnoreNotFound(err)
	})
}
