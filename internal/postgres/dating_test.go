package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

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
