package postgres_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lethe-dev/lethe/internal/postgres"
)

func TestMigrateAppliesOnEmptyDatabaseThenIsANoOp(t *testing.T) {
	ctx := context.Background()
	name, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := postgres.Migrate(ctx, pg.DSN(name))
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	if want := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}; !slices.Equal(first.Applied, want) || first.Version != 23 {
		t.Fatalf("first migrate applied %v (version %d), want %v (version 23)", first.Applied, first.Version, want)
	}
	second, err := postgres.Migrate(ctx, pg.DSN(name))
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if len(second.Applied) != 0 || second.Version != 23 {
		t.Fatalf("second migrate applied %v (version %d), want nothing at version 23", second.Applied, second.Version)
	}
}

func TestMigrateRefusesABadDSNWithoutEchoingIt(t *testing.T) {
	_, err := postgres.Migrate(context.Background(), "postgres://u:s3cret@[::1:bad")
	if err == nil {
		t.Fatal("want an error for a malformed DSN")
	}
	if got := err.Error(); contains(got, "s3cret") {
		t.Fatalf("error echoes the password: %q", got)
	}
}

// The decision record's three validation queries, verbatim, on the reference schema.
func TestDecisionRecordValidationQueries(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))

	// 1. every table with personal-data content cascades from memory.sessions.
	cascading := queryStrings(t, conn, `SELECT conrelid::regclass::text FROM pg_constraint
		WHERE contype = 'f' AND confrelid = 'memory.sessions'::regclass AND confdeltype = 'c'`)
	for _, want := range []string{"memory.rounds", "memory.facts", "memory.fact_corrections", "memory.artifacts", "memory.file_snapshots", "memory.backfill_progress"} {
		if !slices.Contains(cascading, want) {
			t.Errorf("query 1: %s does not cascade from memory.sessions (got %v)", want, cascading)
		}
	}

	// 2. every vector column is on a memory.* table with an FK to sessions (or sessions itself).
	rows, err := conn.Query(ctx, `SELECT table_schema, table_name, column_name FROM information_schema.columns
		WHERE udt_name = 'vector' AND table_schema = 'memory'`)
	if err != nil {
		t.Fatal(err)
	}
	var vecs []string
	var schema, table, column string
	if _, err := pgx.ForEachRow(rows, []any{&schema, &table, &column}, func() error {
		vecs = append(vecs, schema+"."+table+"."+column)
		if qualified := schema + "." + table; qualified != "memory.sessions" && !slices.Contains(cascading, qualified) {
			t.Errorf("query 2: vector column %s.%s is not on a table with a cascading FK to sessions", qualified, column)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(vecs)
	if want := []string{"memory.facts.embedding", "memory.rounds.embedding", "memory.sessions.summary_embedding"}; !slices.Equal(vecs, want) {
		t.Errorf("query 2 returned %v, want %v", vecs, want)
	}

	// 3. exactly the seven tables of the decision record live in schema memory.
	tables := queryStrings(t, conn, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'memory'`)
	slices.Sort(tables)
	want := slices.Clone(postgres.ExpectedTables)
	slices.Sort(want)
	if !slices.Equal(tables, want) {
		t.Errorf("query 3 returned %v, want %v", tables, want)
	}
}

func TestReferenceSchemaIsCompliant(t *testing.T) {
	conn := connect(t, migratedDB(t))
	rep, err := postgres.AuditSchema(context.Background(), conn, "memory")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Compliant() {
		t.Fatalf("reference schema has violations: %+v", rep.Violations)
	}
	if len(rep.CascadingTables) != 6 || len(rep.VectorColumns) != 3 {
		t.Fatalf("audit found cascading %v and vectors %v; want 6 tables and 3 columns", rep.CascadingTables, rep.VectorColumns)
	}
}

func TestBrokenSchemaIsNamedByTheAudit(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	mustExec(t, conn, `CREATE TABLE memory.notes_no_cascade (
		id bigint PRIMARY KEY, session_id uuid REFERENCES memory.sessions (id), embedding vector(3))`)
	mustExec(t, conn, `DROP TABLE memory.backfill_progress`)
	rep, err := postgres.AuditSchema(ctx, conn, "memory")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range rep.Violations {
		got[v.Rule+" "+v.Table] = v.Message
	}
	for _, want := range []string{
		"NoCascade memory.notes_no_cascade",
		"VectorOffCascade memory.notes_no_cascade",
		"MissingTable memory.backfill_progress",
	} {
		if _, ok := got[want]; !ok {
			t.Errorf("audit did not report %q; got %v", want, got)
		}
	}
	if len(rep.Violations) != 3 {
		t.Errorf("want exactly 3 violations, got %+v", rep.Violations)
	}
}

func TestTombstonedSessionIsInvisibleToTheApplicationRole(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	seedTwoSessions(t, conn)
	mustExec(t, conn, `UPDATE memory.sessions SET tombstoned_at = now(), tombstoned_by = 'req-1'
		WHERE id = '00000000-0000-4000-8000-000000000001'`)
	// What Lethe's tombstone transaction writes beside the tombstone: the
	// ledger rows, the content keyed (a store without a tenant: every tenant).
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid) VALUES
		('session', '00000000-0000-4000-8000-000000000001', 'req-1'), ('content', lethe.content_hash('sha-of-erased'), 'req-1')`)

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL ROLE memory_app`); err != nil {
		t.Fatal(err)
	}
	// Raw queries without any tombstone filter: row-level security hides the session everywhere.
	for table, want := range map[string]int{
		"memory.sessions": 1, "memory.rounds": 1, "memory.facts": 1, "memory.fact_corrections": 1,
		"memory.artifacts": 1, "memory.file_snapshots": 1, "memory.backfill_progress": 1,
		"memory_derived.profiles": 1, "memory_derived.embedding_cache": 1,
	} {
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if n != want {
			t.Errorf("application role sees %d rows of %s, want %d (only the live session's)", n, table, want)
		}
	}
	var leaked int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM memory.rounds WHERE session_id = '00000000-0000-4000-8000-000000000001'`).Scan(&leaked); err != nil {
		t.Fatal(err)
	}
	if leaked != 0 {
		t.Errorf("a direct query by session_id returned %d rows of the tombstoned session", leaked)
	}
	// It cannot un-tombstone either: the row is not visible to UPDATE.
	tag, err := tx.Exec(ctx, `UPDATE memory.sessions SET tombstoned_at = NULL, tombstoned_by = NULL
		WHERE id = '00000000-0000-4000-8000-000000000001'`)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 0 {
		t.Errorf("application role un-tombstoned a session")
	}
}

func TestDerivationFromErasedSourceIsRefused(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	seedTwoSessions(t, conn)
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, erased_at)
		VALUES ('session', '00000000-0000-4000-8000-000000000001', 'req-1', now())`)

	// A compaction job deriving a new profile from the erased session fails loudly.
	_, err := conn.Exec(ctx, `WITH p AS (INSERT INTO memory_derived.profiles (kind, summary) VALUES ('project', 'x') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id)
		SELECT id, '00000000-0000-4000-8000-000000000001' FROM p`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "LE001" {
		t.Fatalf("want SQLSTATE LE001 (erasure_lineage_violation), got %v", err)
	}
	// Deriving from the live session still works.
	mustExec(t, conn, `WITH p AS (INSERT INTO memory_derived.profiles (kind, summary) VALUES ('project', 'y') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id)
		SELECT id, '00000000-0000-4000-8000-000000000002' FROM p`)
	// A cancelled ledger entry no longer blocks.
	mustExec(t, conn, `UPDATE lethe.erasure_ledger SET erased_at = NULL, cancelled_at = now()`)
	mustExec(t, conn, `WITH p AS (INSERT INTO memory_derived.profiles (kind, summary) VALUES ('project', 'z') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id)
		SELECT id, '00000000-0000-4000-8000-000000000001' FROM p`)
}

func TestLedgerRefusesBothErasedAndCancelled(t *testing.T) {
	conn := connect(t, migratedDB(t))
	_, err := conn.Exec(context.Background(), `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, erased_at, cancelled_at)
		VALUES ('session', 'x', 'req', now(), now())`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != "ledger_erased_xor_cancelled" {
		t.Fatalf("want the ledger_erased_xor_cancelled check to refuse, got %v", err)
	}
}
