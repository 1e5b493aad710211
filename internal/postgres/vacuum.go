package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// A deleted row stays in its page, readable from the data file (pageinspect,
// a copy of the files, a base backup), until a vacuum removes it; so do its
// index entries. The Deleted step vacuums what it touched.

// vacuumableSQL says, per table $1, whether the role may vacuum it: it owns
// it (directly or by membership), or, from PostgreSQL 17, holds MAINTAIN.
func vacuumableSQL(maintain bool) string {
	check := `pg_has_role(c.relowner, 'USAGE')`
	if maintain {
		check += ` OR has_table_privilege(c.oid, 'MAINTAIN')`
	}
	return `SELECT t, ` + check + ` FROM unnest($1::text[]) t JOIN pg_class c ON c.oid = to_regclass(t)`
}

// vacuumTables are the tables a deletion touches, each once.
func vacuumTables(l Layout) []Table {
	out := append([]Table{l.Sessions}, l.Children...)
	for _, idx := range l.ContentIndexes {
		out = append(out, idx.Table)
	}
	for _, lin := range l.Lineages {
		out = append(out, lin.Table, lin.Derived)
	}
	slices.SortFunc(out, func(a, b Table) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// Vacuum vacuums the tables a deletion touches (erasure.Ledger). Lazy keeps
// the table's tail (TRUNCATE off: truncating takes an exclusive lock);
// Full rewrites each table under an exclusive lock. The Erasers sharing a
// memo share their vacuums (vacuumQueue): the result is that of a vacuum
// that started after the call.
func (e *Eraser) Vacuum(ctx context.Context, mode lethev1.VacuumMode) (erasure.VacuumResult, error) {
	return e.joinVacuum(ctx, mode).wait(ctx)
}

// StartVacuum is Vacuum without the wait (erasure.Ledger): the ticket
// ends with the vacuum joined.
func (e *Eraser) StartVacuum(ctx context.Context, mode lethev1.VacuumMode) *erasure.VacuumTicket {
	r := e.joinVacuum(ctx, mode)
	return erasure.NewVacuumTicket(r.done, func() (erasure.VacuumResult, error) { return r.res, r.err })
}

// joinVacuum joins the next vacuum of the Erasers sharing e's memo that has
// not started (vacuumQueue), which runs detached from ctx.
func (e *Eraser) joinVacuum(ctx context.Context, mode lethev1.VacuumMode) *vacuumRun {
	// The vacuum reads the layout when it starts, not the one this Eraser
	// read: those who join it may have deleted from a table added since.
	m := e.memo()
	fresh := &Eraser{Pool: e.Pool, Schema: e.Schema, TenantID: e.TenantID, ProbeExclude: e.ProbeExclude, Memo: m}
	return m.vacuums.join(ctx, e.Pool, mode, fresh.vacuumNow)
}

// VacuumsStarted is how many vacuums the Erasers sharing e's memo started.
func (e *Eraser) VacuumsStarted() int64 { return e.memo().vacuums.Started() }

// vacuumNow runs one vacuum of the tables a deletion touches.
func (e *Eraser) vacuumNow(ctx context.Context, mode lethev1.VacuumMode) (erasure.VacuumResult, error) {
	var res erasure.VacuumResult
	permitted, denied, err := e.vacuumable(ctx)
	res.NotPermitted = denied
	if err != nil {
		return res, err
	}
	// INDEX_CLEANUP ON: by default a vacuum skips the indexes when few
	// pages have dead tuples, which one erased session in a large table is,
	// and the index entries (an HNSW index holds the embeddings) would stay.
	options := "(INDEX_CLEANUP ON, TRUNCATE false)"
	if mode == lethev1.VacuumFull {
		options = "(FULL)"
	}
	conn, release, err := e.vacuumConn(ctx)
	if err != nil {
		return res, err
	}
	defer release()
	for _, t := range permitted {
		// VACUUM cannot run in a transaction block: one simple-protocol statement.
		if _, err := conn.Exec(ctx, "VACUUM "+options+" "+t.Ident(), pgx.QueryExecModeSimpleProtocol); err != nil {
			return res, fmt.Errorf("vacuum %s: %w", t, err)
		}
		res.Vacuumed++
	}
	return res, conn.QueryRow(ctx, nowSQL).Scan(&res.At)
}

// vacuumable splits the tables a deletion touches into those the role may
// vacuum and the count of those it may not.
func (e *Eraser) vacuumable(ctx context.Context) (permitted []Table, denied int, err error) {
	err = e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		var version int
		if err := tx.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
			return err
		}
		tables := vacuumTables(l)
		names := make([]string, len(tables))
		for i, t := range tables {
			names[i] = t.Ident()
		}
		rows, err := tx.Query(ctx, vacuumableSQL(version >= 170000), names)
		if err != nil {
			return fmt.Errorf("read vacuum permissions: %w", err)
		}
		allowed := map[string]bool{}
		var name string
		var ok bool
		if _, err := pgx.ForEachRow(rows, []any{&name, &ok}, func() error { allowed[name] = ok; return nil }); err != nil {
			return fmt.Errorf("read vacuum permissions: %w", err)
		}
		for _, t := range tables {
			if allowed[t.Ident()] {
				permitted = append(permitted, t)
			} else {
				denied++
			}
		}
		return nil
	})
	return permitted, denied, err
}

// vacuumConn is the connection the vacuums run on, with a lock timeout: a
// vacuum waiting for its lock would queue the application's statements
// behind it (Full takes an exclusive lock).
func (e *Eraser) vacuumConn(ctx context.Context) (DB, func(), error) {
	pool, ok := e.Pool.(acquirer)
	if !ok {
		return e.Pool, func() {}, nil
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	if _, err := c.Exec(ctx, vacuumLockTimeoutSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		c.Release()
		return nil, nil, err
	}
	return c, func() {
		_, _ = c.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`, pgx.QueryExecModeSimpleProtocol)
		c.Release()
	}, nil
}

// acquirer is a pool that lends one connection (pgxpool.Pool): the lock
// timeout and the vacuums must run on the same one.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// vacuumLockTimeoutSQL bounds how long a vacuum waits for its table's lock.
const vacuumLockTimeoutSQL = `SET lock_timeout = '10s'`
