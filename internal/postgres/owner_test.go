package postgres_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// rlsTables are the reference tables with row-level security, and the rows
// of each that belong to the live session of seedTwoSessions.
var rlsTables = map[string]int{
	"memory.sessions": 1, "memory.rounds": 1, "memory.facts": 1, "memory.fact_corrections": 1,
	"memory.artifacts": 1, "memory.file_snapshots": 1, "memory.backfill_progress": 1,
	"memory_derived.profiles": 1, "memory_derived.embedding_cache": 1,
}

// tombstoneFirst tombstones seedTwoSessions' first session as Lethe's
// tombstone transaction does: the mark and the ledger rows.
func tombstoneFirst(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	mustExec(t, conn, `UPDATE memory.sessions SET tombstoned_at = now(), tombstoned_by = 'req-1' WHERE id = $1`, sessionA)
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid) VALUES
		('session', $1, 'req-1'), ('content', lethe.content_hash('sha-of-erased'), 'req-1')`, sessionA)
}

// rowsSeen checks, as role (empty: the connection's own), the rows each
// table of want returns to a query with no filter.
func rowsSeen(t *testing.T, conn *pgx.Conn, role string, want map[string]int) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if role != "" {
			if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
				return err
			}
		}
		for table, n := range want {
			var got int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&got); err != nil {
				return err
			}
			if got != n {
				t.Errorf("as %q: %d rows of %s, want %d", role, got, table, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The table owner is bound by row-level security like the application: a
// member of memory_owner (and memory_owner itself) reads the live session and
// nothing of the tombstoned one, and cannot lift the tombstone.
func TestTableOwnerReadsNoTombstonedSession(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	admin := connect(t, dsn)
	seedTwoSessions(t, admin)
	tombstoneFirst(t, admin)

	if others := queryStrings(t, admin, `SELECT schemaname || '.' || tablename FROM pg_tables
		WHERE schemaname IN ('memory', 'memory_derived') AND tableowner <> 'memory_owner'`); len(others) != 0 {
		t.Errorf("tables not owned by memory_owner: %v", others)
	}
	owner := connect(t, asRole(t, admin, dsn, "lethe_test_owner", "memory_owner"))
	rowsSeen(t, owner, "", rlsTables)
	rowsSeen(t, admin, "memory_owner", rlsTables)

	var n int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM memory.rounds WHERE session_id = $1`, sessionA).Scan(&n); err != nil || n != 0 {
		t.Errorf("the owner reads %d rounds of the tombstoned session by its ID (err %v)", n, err)
	}
	tag, err := owner.Exec(ctx, `UPDATE memory.sessions SET tombstoned_at = NULL, tombstoned_by = NULL WHERE id = $1`, sessionA)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 0 {
		t.Error("the owner lifted a tombstone")
	}
}

// ownershipState is what migration 10 changes, as sorted lines: each
// reference table's owner, row-level security flags and grants; each
// policy's roles; the grants on schema lethe and its functions.
func ownershipState(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	return queryStrings(t, conn, `
		SELECT format('table %s owner=%s rls=%s force=%s acl=%s', c.oid::regclass, pg_get_userbyid(c.relowner),
			c.relrowsecurity, c.relforcerowsecurity, c.relacl)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname IN ('memory', 'memory_derived') AND c.relkind IN ('r', 'p', 'S')
		UNION ALL
		SELECT format('policy %s on %s to %s', p.polname, p.polrelid::regclass,
			array_to_string(ARRAY(SELECT rolname FROM pg_roles WHERE oid = ANY (p.polroles) ORDER BY 1), ','))
		FROM pg_policy p
		UNION ALL
		SELECT format('schema %s acl=%s', nspname, nspacl) FROM pg_namespace WHERE nspname IN ('memory', 'memory_derived', 'lethe')
		UNION ALL
		SELECT format('function %s acl=%s', p.oid::regprocedure, p.proacl)
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'lethe'
		UNION ALL
		SELECT format('undo table %s', to_regclass('lethe.memory_owner_undo'))
		ORDER BY 1`)
}

// Before migration 10 an ingester (a member of memory_app) that owns the
// tables reads a tombstoned session; after it, it owns nothing and reads
// what the application role does, the live session only; Down puts
// every owner, flag, policy and grant back as it was (the ingester reads
// the tombstoned session again), and Up applies again.
func TestForcedRowSecurityMigrationDownRestoresThePreviousState(t *testing.T) {
	dsn, p := databaseAt(t, 9)
	admin := connect(t, dsn)
	seedTwoSessions(t, admin)
	tombstoneFirst(t, admin)
	ingesterDSN := asRole(t, admin, dsn, "lethe_test_ingester", "memory_app")
	mustExec(t, admin, `DO $$ DECLARE r regclass; BEGIN
		FOR r IN SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		         WHERE n.nspname IN ('memory', 'memory_derived') AND c.relkind = 'r' LOOP
			EXECUTE format('ALTER TABLE %s OWNER TO lethe_test_ingester', r);
		END LOOP; END $$`)
	before := ownershipState(t, admin)
	ingester := connect(t, ingesterDSN)
	all := map[string]int{"memory.sessions": 2, "memory.rounds": 2, "memory_derived.profiles": 2}
	rowsSeen(t, ingester, "", all)

	migrateTo(t, p, 10)
	rowsSeen(t, ingester, "", rlsTables)
	rowsSeen(t, admin, "memory_owner", rlsTables)
	if during := ownershipState(t, admin); slices.Equal(during, before) {
		t.Fatal("migration 10 changed no owner, flag, policy or grant")
	}

	migrateTo(t, p, 9)
	if after := ownershipState(t, admin); !slices.Equal(after, before) {
		t.Errorf("after Down:\n%s\nwant:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	rowsSeen(t, ingester, "", all)

	migrateTo(t, p, 10)
	rowsSeen(t, admin, "memory_owner", rlsTables)
}
