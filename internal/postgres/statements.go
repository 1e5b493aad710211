package postgres

import (
	"context"
	"fmt"
	"strings"

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

// sessionHashesSQL selects, as column h, the distinct content hashes of the
// sessions $1 in every content source (there must be one). The plan and
// the ledger read them in the database; the deletion also hands them to
// Lethe, for Verify only, kept in memory (erasure.ContentKeys).
func sessionHashesSQL(l Layout) string {
	sel := make([]string, len(l.ContentSources))
	for i, src := range l.ContentSources {
		sel[i] = `SELECT ` + src.Ident() + ` FROM ` + src.Table.Ident() + ` WHERE ` + l.sessionKey(src.Table) + ` = ANY($1::uuid[])`
	}
	return `SELECT h FROM (` + strings.Join(sel, " UNION ") + `) x(h) WHERE h IS NOT NULL`
}

// contentArgs are the arguments of a statement over idx for the sessions
// ids and the erasing tenant (NULL: every tenant): the tenant is $2 only
// where the index records tenants.
func contentArgs(idx ContentIndex, ids []string, tenant *string) []any {
	if idx.TenantColumn == "" {
		return []any{ids}
	}
	return []any{ids, tenant}
}

// erasedFor is the condition on a row i of idx that an erasure for the
// tenant $2 (NULL: every tenant) removes: the row itself, or the tenant
// from its list. Rows listing no tenant go, as in an index without tenants.
func erasedFor(idx ContentIndex) string {
	if idx.TenantColumn == "" {
		return "true"
	}
	return `($2::text IS NULL OR $2::text = ANY(` + idx.Tenants("i") + `) OR cardinality(` + idx.Tenants("i") + `) = 0)`
}

// countContentSQL counts the entries of a content-keyed table that the
// erasure of the sessions $1 removes or changes, for the tenant $2 (the plan).
func countContentSQL(l Layout, idx ContentIndex) string {
	return `SELECT count(*) FROM ` + idx.Table.Ident() + ` i WHERE i.` + idx.Ident() + ` IN (` + sessionHashesSQL(l) + `) AND ` + erasedFor(idx)
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

// arguments are the statement's parameters.
func (c counting) arguments() []any {
	if c.args == nil {
		return []any{c.arg}
	}
	return c.args
}

func (c counting) run(ctx context.Context, q Querier) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, c.sql, c.arguments()...).Scan(&n); err != nil {
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
