package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// sample reads at most n non-null values of table.column within the scope,
// from pages drawn at random (TABLESAMPLE SYSTEM, sized for about four
// times n rows). why says, when nothing could be sampled, the reason.
//
// Without a tenant the size comes from the table's estimated row count.
// With one it comes from the tenant's own sessions, counted through the
// sessions' tenant index: sizing by the whole table would give a small
// tenant of a large table no rows at all, a sample that finds nothing
// because it read nothing. The values of a table tied by session_id are
// read from the sampled sessions (through an index on session_id when
// there is one), so every sample of a tenant with sessions has some.
func (s SampleScope) sample(ctx context.Context, q Querier, table Table, column string, n int) (values []string, why string, err error) {
	col := pgx.Identifier{column}.Sanitize()
	if s.TenantID == "" {
		rows, err := q.Query(ctx, `SELECT t.`+col+` FROM `+table.Ident()+` t TABLESAMPLE SYSTEM ((SELECT CASE
			WHEN reltuples <= 0 THEN 100 ELSE least(100, greatest(0.01, 400.0 * $1 / reltuples)) END
			FROM pg_class WHERE oid = $2::regclass)) WHERE t.`+col+` IS NOT NULL LIMIT $1`, n, table.Ident())
		if err != nil {
			return nil, "", err
		}
		values, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return values, "", err
	}
	var linked, indexed bool
	if table != s.Sessions {
		if err := q.QueryRow(ctx, sessionLinkSQL, table.Ident()).Scan(&linked, &indexed); err != nil {
			return nil, "", err
		}
		if !linked {
			return nil, "not tied to the store's tenant by a session_id column", nil
		}
	}
	var picked string
	switch {
	case !linked: // the sessions table itself
		picked = `SELECT t.` + col + ` FROM ` + table.Ident() + ` t WHERE t.id IN (SELECT id FROM picked) AND t.` + col + ` IS NOT NULL`
	case indexed:
		// Up to k values a session, k enough for n from the sessions picked.
		picked = `SELECT v.c FROM picked s CROSS JOIN LATERAL (SELECT t.` + col + ` AS c FROM ` + table.Ident() + ` t
			WHERE t.session_id = s.id AND t.` + col + ` IS NOT NULL
			LIMIT greatest(1, ceil($1::numeric / greatest(1, (SELECT count(*) FROM picked))))::int) v`
	default:
		picked = `SELECT t.` + col + ` FROM ` + table.Ident() + ` t WHERE t.session_id IN (SELECT id FROM picked) AND t.` + col + ` IS NOT NULL`
	}
	rows, err := q.Query(ctx, tenantSessionsSQL(s.Sessions)+picked+` LIMIT $1`, n, s.TenantID)
	if err != nil {
		return nil, "", err
	}
	values, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return values, "", err
}

// sessionLinkSQL says whether table $1 has a uuid session_id column, and
// whether an index leads with it.
const sessionLinkSQL = `SELECT a.attnum IS NOT NULL, EXISTS (SELECT FROM pg_index i
		WHERE i.indrelid = a.attrelid AND i.indkey[0] = a.attnum AND i.indisvalid AND i.indpred IS NULL)
	FROM (SELECT to_regclass($1) AS oid) c
	LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'session_id'
		AND a.atttypid = 'uuid'::regtype AND NOT a.attisdropped`

// tenantSessionsSQL starts a query with picked: about 4 × $1 of tenant
// $2's sessions from random pages, sized by the tenant's count (not the
// table's). When the drawn pages hold none of them while the tenant has
// sessions (they sit in a few pages), the first $1 by the index stand in:
// a sample of a tenant with sessions is never empty.
func tenantSessionsSQL(sessions Table) string {
	t := sessions.Ident()
	return `WITH share AS (SELECT least(100, greatest(0.01, 400.0 * $1 / greatest(1, count(*)))) AS pct
			FROM ` + t + ` WHERE tenant_id = $2),
		drawn AS (SELECT id FROM ` + t + ` TABLESAMPLE SYSTEM ((SELECT pct FROM share)) WHERE tenant_id = $2 LIMIT 4 * $1),
		picked AS (SELECT id FROM drawn
			UNION ALL (SELECT id FROM ` + t + ` WHERE tenant_id = $2 AND NOT EXISTS (SELECT FROM drawn) LIMIT $1))
		`
}
