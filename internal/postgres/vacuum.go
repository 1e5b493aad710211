package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

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
// Full rewrites each table under an exclusive lock.
func (e *Eraser) Vacuum(ctx context.Context, mode lethev1.VacuumMode) (erasure.VacuumResult, error) {
	var res erasure.VacuumResult
	var permitted []Table
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
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
				res.NotPermitted++
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	options := "(TRUNCATE false)"
	if mode == lethev1.VacuumFull {
		options = "(FULL)"
	}
	for _, t := range permitted {
		// VACUUM cannot run in a transaction block: one simple-protocol
		// statement on a pooled connection.
		if _, err := e.Pool.Exec(ctx, "VACUUM "+options+" "+t.Ident(), pgx.QueryExecModeSimpleProtocol); err != nil {
			return res, fmt.Errorf("vacuum %s: %w", t, err)
		}
		res.Vacuumed++
	}
	return res, e.Pool.QueryRow(ctx, nowSQL).Scan(&res.At)
}
