package postgres_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// asRole returns dsn with the user replaced by a login role that is a
// member of role (created once per cluster).
func asRole(t *testing.T, conn *pgx.Conn, dsn, login, role string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '`+login+`') THEN
			CREATE ROLE `+login+` LOGIN IN ROLE `+role+`;
		END IF; END $$`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(login)
	return u.String()
}

const (
	sessionA = "00000000-0000-4000-8000-000000000001"
	sessionB = "00000000-0000-4000-8000-000000000002"
)

// S3: the role the manager runs as erases end to end, and cannot do what it
// must not.
func TestOperatorRoleCanEraseAndNothingMore(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	admin := connect(t, dsn)
	seedTwoSessions(t, admin)
	opDSN := asRole(t, admin, dsn, "lethe_test_operator", "lethe_operator")

	pool, err := postgres.Connect(ctx, opDSN, postgres.Options{Vector: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory"}
	req := erasure.Request{UID: "role-test", SessionIDs: []string{sessionA}}
	plan, err := e.Tombstone(ctx, req)
	if err != nil || len(plan.Found) != 1 {
		t.Fatalf("tombstone as lethe_operator: %v (plan %+v)", err, plan)
	}
	res, err := e.Delete(ctx, req, 10, 4)
	if err != nil {
		t.Fatalf("delete as lethe_operator: %v", err)
	}
	checks, err := verifyBothWays(ctx, e, req, res.ContentKeys)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if c.Found != 0 {
			t.Errorf("%s: %d left", c.Check, c.Found)
		}
	}
	// Receipts of work done outside Postgres: an explicit batch, and an
	// appended one (its key chosen under an advisory lock).
	if err := e.WriteReceipt(ctx, req.UID, erasure.StepGraph, 0, 1, nil); err != nil {
		t.Fatalf("write a receipt as lethe_operator: %v", err)
	}
	if err := e.AppendReceipt(ctx, req.UID, erasure.StepGraph, 1, nil); err != nil {
		t.Fatalf("append a receipt as lethe_operator: %v", err)
	}
	if r, err := e.Receipts(ctx, req.UID, erasure.StepGraph); err != nil || len(r) != 2 {
		t.Fatalf("graph receipts as lethe_operator: %v %+v, want batches 0 and 1", err, r)
	}

	op := connect(t, opDSN)
	for _, stmt := range []string{
		`DROP TABLE memory.rounds`,
		`TRUNCATE memory.facts`,
		`INSERT INTO memory.sessions (id) VALUES ('99999999-9999-4999-8999-999999999999')`,
		`UPDATE memory.sessions SET summary = 'x'`,
		`DELETE FROM lethe.erasure_receipts`,
		`UPDATE lethe.erasure_receipts SET digest = 'x'`,
		`DELETE FROM lethe.erasure_ledger`,
		`CREATE TABLE memory.x (id int)`,
		`ALTER TABLE memory.sessions DISABLE ROW LEVEL SECURITY`,
	} {
		_, err := op.Exec(ctx, stmt)
		if err == nil {
			t.Errorf("lethe_operator may: %s", stmt)
			continue
		}
		if !strings.Contains(err.Error(), "permission denied") && !strings.Contains(err.Error(), "must be owner") {
			t.Errorf("%s: %v (want a permission error)", stmt, err)
		}
	}

	// The application role does not see the other session's tombstoned rows.
	if _, err := admin.Exec(ctx, `UPDATE memory.sessions SET tombstoned_at = now(), tombstoned_by = 'x' WHERE id = $1`, sessionB); err != nil {
		t.Fatal(err)
	}
	app := connect(t, asRole(t, admin, dsn, "lethe_test_app", "memory_app"))
	var n int
	if err := app.QueryRow(ctx, `SELECT count(*) FROM memory.rounds WHERE session_id = $1`, sessionB).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the application role reads %d rounds of a tombstoned session (err %v)", n, err)
	}
	if err := op.QueryRow(ctx, `SELECT count(*) FROM memory.rounds WHERE session_id = $1`, sessionB).Scan(&n); err != nil || n == 0 {
		t.Fatalf("lethe_operator cannot read a tombstoned session's rounds (%d, err %v): it needs them to plan", n, err)
	}
}
