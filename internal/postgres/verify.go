package postgres

import (
	"context"
	"fmt"
	"strings"

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
// sessions the ledger does not record as erased: one statement, so every
// count is read under one snapshot, in one round trip and no transaction.
// keys decide how the content indexes are searched (leftContentSQL).
func (e *Eraser) Verify(ctx context.Context, req erasure.Request, keys erasure.ContentKeys) ([]erasure.Verification, error) {
	l, err := e.layout(ctx, e.Pool)
	if err != nil {
		return nil, err
	}
	checks := leftoverChecks(l, req.SessionIDs)
	out := make([]erasure.Verification, len(checks))
	counts := make([]string, len(checks))
	for i, c := range checks {
		out[i].Check = c.name
		counts[i] = `(` + c.sql + `)`
	}
	// $2 and $3 are named whatever the checks: a store without a content
	// index would otherwise leave their types undetermined.
	var found []int64
	if err := e.Pool.QueryRow(ctx, `SELECT ARRAY[`+strings.Join(counts, ", ")+`]::bigint[], $2::text, $3::text[]`,
		req.SessionIDs, req.UID, []string(keys)).Scan(&found, nil, nil); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	for i := range out {
		out[i].Found = found[i]
	}
	return out, nil
}

// countLineageSQL counts the lineage rows that name one of the sessions $1.
func countLineageSQL(lin Lineage) string {
	return `SELECT count(*) FROM ` + lin.Table.Ident() + ` WHERE ` + lin.SourceMatch(1)
}

// leftContentSQL counts the entries of a content-keyed table whose keyed
// hash is one of the request $2's content ledger rows and that the erasure
// should have removed: any such entry, or, where the table records tenants
// and the row names one, an entry that still lists that tenant or none.
//
// The sessions are gone, and the ledger holds only keyed hashes. When the
// content hashes $3 the deletion read cover every content ledger row of
// the request (keysCoverLedgerSQL), every entry the count can find has one
// of them as its key: the entries are looked up by $3, by index. Otherwise
// (NULL, or some content's hash is missing) every distinct key of the
// table is hashed in one call, and only when the request erased content.
// Hashing is what costs, so a table with fewer entries than $3 has them
// hashed too: the cheaper way, and the same count. CASE runs one branch:
// the other's subqueries are never executed.
func leftContentSQL(idx ContentIndex) string {
	tenant := ""
	if idx.TenantColumn != "" {
		tenant = ` AND (l.tenant_id IS NULL OR l.tenant_id = ANY(` + idx.Tenants("i") + `) OR cardinality(` + idx.Tenants("i") + `) = 0)`
	}
	key := `i.` + idx.Ident()
	left := func(candidates string) string {
		return `SELECT count(*) FROM ` + idx.Table.Ident() + ` i WHERE ` + candidates + `
			AND EXISTS (SELECT 1 FROM lethe.erasure_ledger l WHERE l.request_uid = $2 AND l.scope = 'content'
				AND l.record_id = lethe.content_hash(` + key + `)` + tenant + `)`
	}
	byKeys := left(key + ` = ANY($3::text[])`)
	byScan := left(key + ` IN (SELECT h.sha FROM (` + keyChunksSQL(idx) + `) c, lethe.content_hashes(c.chunk) h
		WHERE h.keyed IN (SELECT record_id FROM lethe.erasure_ledger WHERE request_uid = $2 AND scope = 'content'))`)
	fewerEntries := `(SELECT count(*) FROM (SELECT FROM ` + idx.Table.Ident() + ` LIMIT cardinality($3::text[])) e) < cardinality($3::text[])`
	return `SELECT CASE WHEN $3::text[] IS NOT NULL AND NOT ` + fewerEntries + ` AND ` + keysCoverLedgerSQL + `
		THEN (` + byKeys + `) ELSE (` + byScan + `) END`
}

// keyChunksSQL selects, as column chunk, the distinct keys of idx (only
// when the request $2 erased content) in arrays of about 50,000 by the
// table's row estimate (its size, never analyzed), each from a read of the
// table: one array of every
// key would hold the whole key column in one value, which PostgreSQL caps
// at 1 GB. (Grouping the keys into arrays in one read cost about 30 ms
// more per verification even when this branch did not run.) Distinct byte
// for byte (COLLATE "C"): under a case-insensitive collation, DISTINCT
// would keep one of two keys that hash differently.
func keyChunksSQL(idx ContentIndex) string {
	return `SELECT ARRAY(SELECT DISTINCT i.` + idx.Ident() + `::text COLLATE "C" FROM ` + idx.Table.Ident() + ` i
			WHERE abs(hashtext(i.` + idx.Ident() + `::text)) % g.n = g.k
			  AND EXISTS (SELECT 1 FROM lethe.erasure_ledger WHERE request_uid = $2 AND scope = 'content')) AS chunk
		FROM (SELECT k, n FROM (SELECT (CASE WHEN reltuples >= 0 THEN reltuples ELSE pg_relation_size(oid) / 100 END / 50000)::int + 1 AS n
			FROM pg_class WHERE oid = ` + quoteLiteral(idx.Table.Ident()) + `::regclass) c, generate_series(0, c.n - 1) k) g`
}

// quoteLiteral is s as an SQL string literal (standard_conforming_strings).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// keysCoverLedgerSQL holds when the content hashes $3, keyed,
// include the record of every content ledger row of the request $2: one
// call of lethe.content_hashes into a hash table, one read of the
// request's ledger rows. NOT IN, not an anti join, so that the planner
// cannot choose a nested loop over both (keyed is never NULL).
const keysCoverLedgerSQL = `NOT EXISTS (SELECT 1 FROM lethe.erasure_ledger l
		WHERE l.request_uid = $2 AND l.scope = 'content'
		  AND l.record_id NOT IN (SELECT h.keyed FROM lethe.content_hashes($3::text[]) h))`

// verifyCheck is one of Verify's counts: its name in the evidence and its
// statement, of the sessions $1, the request $2 (text) and the content
// hashes $3 the deletion read (text[], NULL: none).
type verifyCheck struct{ name, sql string }

// leftoverChecks are Verify's checks, in the order they are reported.
func leftoverChecks(l Layout, ids []string) []verifyCheck {
	var cs []verifyCheck
	for _, c := range rowCountings(l, ids, "verify") {
		cs = append(cs, verifyCheck{name: "rows of the sessions in " + c.name, sql: c.sql})
	}
	for _, idx := range l.ContentIndexes {
		cs = append(cs, verifyCheck{name: erasure.CheckPrefixContent + idx.Table.String(), sql: leftContentSQL(idx)})
	}
	for _, lin := range l.Lineages {
		cs = append(cs, verifyCheck{name: erasure.CheckPrefixDerived + lin.Table.String(), sql: countLineageSQL(lin)})
	}
	return append(cs, verifyCheck{name: "requested sessions the ledger does not record as erased", sql: notErasedSQL})
}
