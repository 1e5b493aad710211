package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// notErasedSQL counts the sessions $1 no request holds erased in the ledger
// (a session another request erased first counts as erased). Each session
// is one lookup of erasure_ledger_active_idx on (scope, record_id), whatever
// the ledger's statistics say: as a NOT EXISTS anti join, a ledger whose
// statistics are stale (it grows by a row per session erased) was read
// whole for every request verified. An erased row is never cancelled
// (CHECK ledger_erased_xor_cancelled), so cancelled_at IS NULL, the index's
// predicate, changes no answer.
const notErasedSQL = `SELECT count(*) FROM unnest($1::text[]) AS r
	LEFT JOIN LATERAL (SELECT true AS erased FROM lethe.erasure_ledger l
		WHERE l.scope = 'session' AND l.record_id = r AND l.cancelled_at IS NULL AND l.erased_at IS NOT NULL
		LIMIT 1) e ON true
	WHERE e.erased IS NULL`

// Verify looks for anything left of the sessions req names — what the
// request found, not what the ledger says was erased: a session a batch
// skipped is found here. It counts rows in sessions and every cascading
// table, content-index entries of their content, lineage rows, and the
// sessions the ledger does not record as erased.
func (e *Eraser) Verify(ctx context.Context, req erasure.Request) ([]erasure.Verification, error) {
	var out []erasure.Verification
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		checks := leftoverChecks(l, req.UID, req.SessionIDs)
		checks = append(checks, counting{name: "requested sessions the ledger does not record as erased", failure: "verify the ledger",
			sql: notErasedSQL, arg: req.SessionIDs})
		var err error
		out, err = runChecks(ctx, tx, checks)
		return err
	})
	return out, err
}

// countLineageSQL counts the lineage rows that name one of the sessions $1.
func countLineageSQL(lin Lineage) string {
	return `SELECT count(*) FROM ` + lin.Table.Ident() + ` WHERE ` + lin.SourceMatch(1)
}

// leftContentSQL counts the entries of a content-keyed table whose keyed
// hash is one of the request $1's content ledger rows and that the erasure
// should have removed: any such entry, or, where the table records tenants
// and the row names one, an entry that still lists that tenant or none.
// The sessions are gone, and the ledger holds only keyed hashes: each key
// of the table is hashed once (a scan), and only when the request erased
// content.
func leftContentSQL(idx ContentIndex) string {
	tenant := ""
	if idx.TenantColumn != "" {
		tenant = ` AND (l.tenant_id IS NULL OR l.tenant_id = ANY(` + idx.Tenants("i") + `) OR cardinality(` + idx.Tenants("i") + `) = 0)`
	}
	return `SELECT count(*) FROM ` + idx.Table.Ident() + ` i
		WHERE EXISTS (SELECT 1 FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'content')
		  AND EXISTS (SELECT 1 FROM lethe.erasure_ledger l WHERE l.request_uid = $1 AND l.scope = 'content'
			AND l.record_id = lethe.content_hash(i.` + idx.Ident() + `)` + tenant + `)`
}

// leftoverChecks are Verify's checks, in the order they are reported.
func leftoverChecks(l Layout, uid string, ids []string) []counting {
	cs := rowCountings(l, ids, "verify")
	for i := range cs {
		cs[i].name = "rows of the sessions in " + cs[i].name
	}
	for _, idx := range l.ContentIndexes {
		t := idx.Table.String()
		cs = append(cs, counting{name: erasure.CheckPrefixContent + t, failure: "verify " + t, sql: leftContentSQL(idx), arg: uid})
	}
	for _, lin := range l.Lineages {
		t := lin.Table.String()
		cs = append(cs, counting{name: erasure.CheckPrefixDerived + t, failure: "verify " + t, sql: countLineageSQL(lin), arg: ids})
	}
	return cs
}

// runChecks runs every check in one pipelined round trip, in order.
func runChecks(ctx context.Context, tx pgx.Tx, cs []counting) ([]erasure.Verification, error) {
	out := make([]erasure.Verification, len(cs))
	var p pipeline
	for i, c := range cs {
		out[i].Check = c.name
		p.queryRow(c.failure, c.sql, c.arguments(), func(row pgx.Row) error {
			return row.Scan(&out[i].Found)
		})
	}
	if err := p.send(ctx, tx); err != nil {
		return nil, err
	}
	return out, nil
}
