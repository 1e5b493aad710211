package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// A table added after the store's last audit, with a session_id and no
// cascading key, holds rows of a tombstoned session: the deletion reads the
// catalog in its own transaction and refuses before it deletes anything,
// naming the table. Once the key cascades (and, a table holding a
// session's rows, it hides them with forced row-level security), it goes
// ahead and takes them.
func TestDeletionRefusesASchemaChangedSinceTheAudit(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-guard", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `CREATE TABLE memory.session_notes (session_id uuid REFERENCES memory.sessions (id), note text)`)
	mustExec(t, conn, `INSERT INTO memory.session_notes VALUES ($1, 'n')`, sessA)

	_, err := e.Delete(ctx, req, 10, 0)
	var ce *erasure.ConfigError
	if !errors.As(err, &ce) || ce.Reason != lethev1.ReasonSchemaChanged || !strings.Contains(ce.Message, "memory.session_notes") {
		t.Fatalf("deletion on a schema that changed: %v, want a %s configuration error naming memory.session_notes", err, lethev1.ReasonSchemaChanged)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 1 {
		t.Fatalf("the session was deleted though the schema breaks the rules (%d left)", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, req.UID); n != 0 {
		t.Errorf("%d Deleted receipts for a refused deletion", n)
	}

	mustExec(t, conn, `ALTER TABLE memory.session_notes DROP CONSTRAINT session_notes_session_id_fkey,
		ADD FOREIGN KEY (session_id) REFERENCES memory.sessions (id) ON DELETE CASCADE`)
	mustExec(t, conn, `CREATE INDEX ON memory.session_notes (session_id)`)
	hideTombstoned(t, conn, "memory.session_notes")
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatalf("deletion once the key cascades: %v", err)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.session_notes`); n != 0 {
		t.Errorf("%d rows of the erased session left in the new table", n)
	}
}

// hideTombstoned wires table (with a session_id) as migrations 00003, 00004
// and 00010 wire the reference tables: forced row-level security, the
// application's policy (its owner's too) and Lethe's.
func hideTombstoned(t *testing.T, conn *pgx.Conn, table string) {
	t.Helper()
	mustExec(t, conn, `ALTER TABLE `+table+` ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY`)
	mustExec(t, conn, `CREATE POLICY app_live_session_rows ON `+table+` TO memory_app, memory_owner
		USING (EXISTS (SELECT 1 FROM memory.sessions s WHERE s.id = session_id))`)
	mustExec(t, conn, `CREATE POLICY lethe_operator_all ON `+table+` TO lethe_operator USING (true) WITH CHECK (true)`)
}
