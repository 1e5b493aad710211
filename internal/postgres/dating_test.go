package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// undatingDB runs every statement but the dating after a batch's commit,
// which fails as if the manager died between the commit and the dating.
type undatingDB struct{ postgres.DB }

var errDiedBeforeDating = errors.New("simulated death between the batch's commit and its dating")

// dating reports whether sql is one of the datings after a commit.
func dating(sql string) bool {
	return strings.Contains(sql, "SET erased_at = greatest(erased_at, clock_timestamp())")
}

func (d undatingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if dating(sql) {
		return pgconn.CommandTag{}, errDiedBeforeDating
	}
	return d.DB.Exec(ctx, sql, args...)
}

func (d undatingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if dating(sql) {
		return failedRow{errDiedBeforeDating}
	}
	return d.DB.QueryRow(ctx, sql, args...)
}

type failedRow struct{ err error }

func (r failedRow) Scan(...any) error { return r.err }

// undated counts the request's erased sessions whose ledger row was last
// written by their batch's own transaction (the one that wrote its
// receipt): not dated after the commit.
func undated(t *testing.T, conn *pgx.Conn, uid string) int64 {
	t.Helper()
	return count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger l WHERE l.request_uid = $1 AND l.scope = 'session'
		AND l.erased_at IS NOT NULL AND l.xmin::text IN (SELECT r.xmin::text FROM lethe.erasure_receipts r WHERE r.request_uid = $1)`, uid)
}

// A manager that dies between a batch's commit and its dating leaves that
// batch's erasure time early: a Backup that started while the commit still
// waited (a synchronous standby) would count as taken after the deletion.
// The batch is done, so the next pass skips it; it must still date it,
// whether the death came after a middle batch (the next pass's last batch
// erases sessions) or after the last (the next pass erases none), and
// report the dated time with its position.
func TestADatingLostToADeathIsDoneByTheNextPass(t *testing.T) {
	for _, died := range []struct {
		name  string
		batch int // the batch whose dating is lost (5 sessions in batches of 2: 0, 1, 2)
	}{{"after a middle batch", 0}, {"after the last batch", 2}} {
		t.Run(died.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := migratedDB(t)
			conn := connect(t, dsn)
			ids := seedTiny(t, conn, "d0000000", 5)
			e := eraser(t, dsn, "t1")
			req := erasure.Request{UID: "uid-undated", SessionIDs: ids}
			if _, err := e.Tombstone(ctx, req); err != nil {
				t.Fatal(err)
			}
			if died.batch > 0 {
				// The batches before it ran whole: an earlier pass that ended there.
				if _, err := e.Delete(ctx, erasure.Request{UID: req.UID, SessionIDs: ids[:2*died.batch]}, 2, 0); err != nil {
					t.Fatal(err)
				}
			}
			dying := &postgres.Eraser{Pool: undatingDB{e.Pool}, Schema: "memory", TenantID: "t1"}
			_, err := dying.Delete(ctx, req, 2, 0)
			if !errors.Is(err, errDiedBeforeDating) || !strings.Contains(err.Error(), fmt.Sprintf("batch %d", died.batch)) {
				t.Fatalf("deletion dying before the dating of batch %d: %v", died.batch, err)
			}
			lost := undated(t, conn, req.UID)
			if want := int64(min(2, 5-2*died.batch)); lost != want {
				t.Fatalf("%d sessions left undated by the death, want batch %d's %d", lost, died.batch, want)
			}
			res, err := e.Delete(ctx, req, 2, 0)
			if err != nil {
				t.Fatal(err)
			}
			if n := undated(t, conn, req.UID); n != 0 {
				t.Errorf("after the next pass, %d of the sessions are still not dated after their batch's commit", n)
			}
			if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND erased_at_provisional`, req.UID); n != 0 {
				t.Errorf("after the next pass, %d ledger rows are still provisional", n)
			}
			erasedWithPosition(t, e, req.UID, res)
			// Dated once: a further pass moves nothing.
			before, err := e.DeletedAt(ctx, req.UID)
			if err != nil {
				t.Fatal(err)
			}
			again, err := e.Delete(ctx, req, 2, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !again.ErasedAt.Equal(before) {
				t.Errorf("a pass after the dating moved the erasure time from %v to %v", before, again.ErasedAt)
			}
		})
	}
}

// A re-erasure erases again, in one transaction, sessions a restore
// brought back: their ledger rows are dated past its commit too, and none
// stays provisional (no deletion pass follows a re-erasure to sweep them).
func TestAReerasureIsDatedPastItsCommit(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-reerased", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	resurrect(t, conn, sessA)
	res, err := e.Reerase(ctx, req)
	if err != nil || res.Sessions != 1 {
		t.Fatalf("re-erasure: %+v, %v", res, err)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger l WHERE l.request_uid = $1 AND l.scope = 'session'
		AND l.xmin::text IN (SELECT r.xmin::text FROM lethe.erasure_receipts r WHERE r.request_uid = $1 AND r.step = 'Resurrected')`, req.UID); n != 0 {
		t.Errorf("%d session(s) erased again but not dated past the re-erasure's commit", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND erased_at_provisional`, req.UID); n != 0 {
		t.Errorf("%d ledger row(s) left provisional by the re-erasure", n)
	}
}

// Migration 00021 marks the datings already lost when it runs: a session
// row last written by its batch's own transaction (the one that wrote the
// Deleted receipt), not one dated after the commit, nor one whose request
// wrote no Deleted receipt in that transaction. The next deletion pass
// then dates it. Down dates what is still provisional before dropping the
// column.
func TestMigrationMarksTheDatingsAlreadyLost(t *testing.T) {
	ctx := context.Background()
	dsn, p := databaseAt(t, 20)
	conn := connect(t, dsn)
	insert := func(uid, session string) {
		mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at, erased_at)
			VALUES ('session', $2, $1, now(), now(), now())`, uid, session)
	}
	receipt := func(uid string) {
		mustExec(t, conn, `INSERT INTO lethe.erasure_receipts (request_uid, step, digest) VALUES ($1, 'Deleted', 'd')`, uid)
	}
	// Lost: erased and receipted in one transaction, never dated.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"lost-1", "lost-2"} {
		if _, err := tx.Exec(ctx, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at, erased_at)
			VALUES ('session', $1, 'uid-lost', now(), now(), now())`, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO lethe.erasure_receipts (request_uid, step, digest) VALUES ('uid-lost', 'Deleted', 'd')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Dated: written again after the receipt's transaction.
	insert("uid-dated", "dated-1")
	receipt("uid-dated")
	mustExec(t, conn, `UPDATE lethe.erasure_ledger SET erased_at = clock_timestamp() WHERE request_uid = 'uid-dated'`)
	migrateTo(t, p, 21)
	marked := queryStrings(t, conn, `SELECT record_id FROM lethe.erasure_ledger WHERE erased_at_provisional ORDER BY 1`)
	if strings.Join(marked, ",") != "lost-1,lost-2" {
		t.Fatalf("marked provisional: %v, want the two whose dating was lost", marked)
	}
	var before time.Time
	if err := conn.QueryRow(ctx, `SELECT max(erased_at) FROM lethe.erasure_ledger WHERE request_uid = 'uid-lost'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	migrateTo(t, p, 20)
	var after time.Time
	if err := conn.QueryRow(ctx, `SELECT min(erased_at) FROM lethe.erasure_ledger WHERE request_uid = 'uid-lost'`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !after.After(before) {
		t.Errorf("down from 21: the provisional rows' erasure time %v was not dated past %v before the column went", after, before)
	}
}
