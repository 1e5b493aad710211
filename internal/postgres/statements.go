package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Per-table statements shared by several steps, built from the layout in
// one place each, so that the plan, the deletion and the verification
// always look at the same rows. Identifiers come from the catalog and are
// quoted; values are always parameters. Statements run by one step only
// are built (or declared as constants) next to it.

// nowSQL reads the database's clock.
const nowSQL = `SELECT now()`

// sessionKey quotes the column that names the session in t.
func (l Layout) sessionKey(t Table) string {
	if t == l.Sessions {
		return pgx.Identifier{"id"}.Sanitize()
	}
	return pgx.Identifier{"session_id"}.Sanitize()
}

// cascading are the sessions table and the tables that cascade from it.
func (l Layout) cascading() []Table {
	return append([]Table{l.Sessions}, l.Children...)
}

// countRowsSQL counts the rows of t that belong to the sessions $1 (the
// plan counts what will go; Verify counts what is left).
func countRowsSQL(l Layout, t Table) string {
	return `SELECT count(*) FROM ` + t.Ident() + ` WHERE ` + l.sessionKey(t) + ` = ANY($1::uuid[])`
}

// countContentSQL counts the entries of a content-keyed table whose key is
// one of the hashes $1 (plan and Verify).
func countContentSQL(idx QColumn) string {
	return `SELECT count(*) FROM ` + idx.Table.Ident() + ` WHERE ` + idx.Ident() + ` = ANY($1::text[])`
}

// lockSessionsSQL takes, in a fixed order, the exclusive transaction-scoped
// lock of each session $1 that the lineage guard takes shared: a derivation
// from one of them that started first commits before the tombstone is
// written, and one that comes later is refused by the guard.
const lockSessionsSQL = `SELECT count(pg_advisory_xact_lock(hashtext('lethe.session'), hashtext(id)))
	FROM (SELECT id FROM unnest($1::text[]) AS id ORDER BY id) s`

// tombstoneSQL hides the sessions $1 from the application on behalf of the
// request $2, keeping an earlier tombstone (Tombstone and Reerase).
func tombstoneSQL(l Layout) string {
	return `UPDATE ` + l.Sessions.Ident() + ` SET tombstoned_at = now(), tombstoned_by = $2
		WHERE id = ANY($1::uuid[]) AND tombstoned_at IS NULL`
}

// counting is one count(*)-like statement with its one argument: what it
// counts (name) and what an error is prefixed with.
type counting struct {
	name, failure, sql string
	// arg is the statement's one parameter; args, when set, all of them.
	arg  any
	args []any
}

func (c counting) run(ctx context.Context, q Querier) (int64, error) {
	var n int64
	args := c.args
	if args == nil {
		args = []any{c.arg}
	}
	if err := q.QueryRow(ctx, c.sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", c.failure, err)
	}
	return n, nil
}

// sum runs every counting and adds the counts up.
func sum(ctx context.Context, q Querier, cs []counting) (int64, error) {
	var total int64
	for _, c := range cs {
		n, err := c.run(ctx, q)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// rowCountings count the rows of the sessions ids in sessions and every
// table cascading from it (the plan and Verify); verb prefixes errors.
func rowCountings(l Layout, ids []string, verb string) []counting {
	var cs []counting
	for _, t := range l.cascading() {
		cs = append(cs, counting{name: t.String(), failure: verb + " " + t.String(), sql: countRowsSQL(l, t), arg: ids})
	}
	return cs
}
