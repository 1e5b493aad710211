package controllers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// A database restored into a freshly migrated one — a real pg_dump after
// the erasure; the database dropped, created, migrated (a new erasure key)
// and filled by pg_restore --data-only, whose copy of the key collides with
// the migration's and is skipped — holds every ledger row and no erased
// session, so it reads intact, yet its keyed hashes match nothing: an erased
// transcript is ingested again without LE002. The store's audit must say
// so, from the key the ledger rows say they are under; putting back the
// key row of the dump, the remedy the runbook names, mends it.
func TestRestoreUnderAnotherErasureKeyIsReported(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "key-change")
	db := databaseOf(t, e.dsn)
	er := e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	uid := string(er.UID)
	eventually(t, 30*time.Second, func() error {
		if !recorded(t, e, uid) {
			return fmt.Errorf("request %s not in the store's record yet", uid)
		}
		return nil
	})
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)
	keyID := func() string {
		var id string
		if err := e.conn.QueryRow(ctx, `SELECT coalesce(lethe.erasure_key_id(), '')`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	before := keyID()
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, dump); err != nil {
		t.Fatal(err)
	}

	// Filled beside the store's database and put in its place once full: an
	// audit of it half-restored would write ledger rows the data then
	// collides with.
	fresh := db + "_fresh"
	if err := pg.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{fresh}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Migrate(ctx, pg.DSN(fresh)); err != nil {
		t.Fatal(err)
	}
	out, err := pg.PgRestore(fresh, dump, "--data-only", "--disable-triggers")
	if err == nil || !strings.Contains(string(out), "erasure_key") {
		t.Fatalf("pg_restore --data-only into the migrated database: %v, want the dump's key row refused\n%s", err, out)
	}
	if err := pg.Exec(ctx, "postgres", "DROP DATABASE "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "postgres", "ALTER DATABASE "+pgx.Identifier{fresh}.Sanitize()+" RENAME TO "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	e.conn = connectVector(t, e.dsn)
	if after := keyID(); after == before || after == "" {
		t.Fatalf("erasure key %q after the restore, %q before: the case this test is about did not happen", after, before)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'source'`, uid); n == 0 {
		t.Fatal("no source rows of the request after the restore: the data was not restored")
	}
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, []string{erasedA, erasedA2}); n != 0 {
		t.Fatalf("%d erased sessions after the restore, want 0", n)
	}
	if err := ingestErased(ctx, e.conn); err != nil {
		t.Fatalf("under the new key an erased transcript is still refused (%v): the premise does not hold", err)
	}

	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionFalse, lethev1.ReasonErasureKeyChanged)
	eventually(t, 10*time.Second, func() error {
		if n := storeEvents(t, e.store, lethev1.ReasonErasureKeyChanged); n != 1 {
			return fmt.Errorf("%d %s events on the store, want 1", n, lethev1.ReasonErasureKeyChanged)
		}
		return nil
	})
	if v := gaugeValue(t, "lethe_memorystore_erasures_under_another_key", "namespace", e.ns); v != 1 {
		t.Errorf("lethe_memorystore_erasures_under_another_key for the store: %v, want 1", v)
	}

	// The runbook's remedy, as it says it.
	script, err := pg.PgRestoreScript(dump, "--data-only", "--schema=lethe", "--table=erasure_key")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "erasure-key.sql")
	if err := os.WriteFile(keyFile, script, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := pg.Psql(db, "--single-transaction", "-c", "DELETE FROM lethe.erasure_key", "-f", keyFile); err != nil {
		t.Fatalf("put the key row back: %v\n%s", err, out)
	}
	if after := keyID(); after != before {
		t.Fatalf("erasure key %q after putting it back, want %q", after, before)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)
	if err := ingestErased(ctx, e.conn); !strings.Contains(fmt.Sprint(err), "LE002") {
		t.Errorf("re-ingesting an erased transcript once the key is back: %v, want SQLSTATE LE002", err)
	}
	if v := gaugeValue(t, "lethe_memorystore_erasures_under_another_key", "namespace", e.ns); v != 0 {
		t.Errorf("lethe_memorystore_erasures_under_another_key once the key is back: %v, want 0", v)
	}
}

// ingestErased inserts, as the memory system, a session from erasedA's
// transcript file, and rolls it back: nil when the database accepts it.
func ingestErased(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL ROLE memory_app;
		INSERT INTO memory.sessions (id, tenant_id, source_path, started_at) VALUES (gen_random_uuid(), 't1', 'raw-jsonl/`+erasedA+`.jsonl', now())`)
	return err
}
