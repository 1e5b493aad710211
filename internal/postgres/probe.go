package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgvector/pgvector-go"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// vectorColumnsSQL lists every vector column of every schema, with its
// declared dimensions (-1 when undeclared).
const vectorColumnsSQL = `SELECT n.nspname, c.relname, a.attname, a.atttypmod
	FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	JOIN pg_type t ON t.oid = a.atttypid
	WHERE t.typname = 'vector' AND c.relkind IN ('r', 'p') AND NOT a.attisdropped
	  AND n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2, 3`

// vectorColumn is a vector column and its declared dimensions.
type vectorColumn struct {
	col  QColumn
	dims int
}

// ProbeResidue runs a nearest-neighbour query with each probe vector against
// every vector column of matching dimension outside the cascade (every
// schema) and reports the columns holding a near-identical vector (cosine
// distance below maxDistance): a copy that the cascade missed. Columns on
// sessions and the tables cascading from it are skipped: a vector there sits
// on a row of a live session (the same text said in another session is that
// session's own data, not residue). Likewise an entry of erased content in
// a content index that records tenants is skipped while an erasure does not
// hide it from an unknown reader (lethe.is_erased_content): another tenant
// still uses that text, and it is that tenant's data. A copy under a key no
// erasure names is residue as anywhere else. Tables the store excludes are
// skipped.
func (e *Eraser) ProbeResidue(ctx context.Context, probe []erasure.Embedding, maxDistance float64) ([]erasure.Residue, error) {
	if len(probe) == 0 {
		return nil, nil
	}
	l, err := e.layout(ctx, e.Pool)
	if err != nil {
		return nil, err
	}
	cols, err := e.vectorColumns(ctx)
	if err != nil {
		return nil, err
	}
	vecs := vectors(probe)
	cascade := l.inCascade()
	rows := probedContentRows(l)
	var p pipeline
	// pgvector 0.8's iterative index scans, if a database turns them on,
	// would walk up to hnsw.max_scan_tuples entries for every vector that
	// has no copy (most of them) under nearCopiesSQL's distance condition.
	// Off for this transaction; nothing where the setting does not exist.
	p.exec("keep iterative index scans off", `SELECT CASE WHEN current_setting('hnsw.iterative_scan', true) IS NOT NULL
		THEN set_config('hnsw.iterative_scan', 'off', true) END`, nil, func(pgconn.CommandTag) error { return nil })
	setting := len(p.names)
	found := map[string]int64{}
	var order []string
	for _, c := range cols {
		if cascade[c.col.Table] || e.excluded(c.col.Table) {
			continue
		}
		name := c.col.String()
		order = append(order, name)
		queueNearCopies(&p, c, nearCopiesSQL(c.col, rows[c.col.Table]), vecs, maxDistance, func(n int64) { found[name] += n })
	}
	if len(p.names) == setting {
		return nil, nil
	}
	// One round trip for every vector of the sample against every column,
	// in a read-only transaction (a pipeline needs one).
	if err := pgx.BeginTxFunc(ctx, e.Pool, readOnly, func(tx pgx.Tx) error { return p.send(ctx, tx) }); err != nil {
		return nil, err
	}
	var out []erasure.Residue
	for _, name := range order {
		if found[name] > 0 {
			out = append(out, erasure.Residue{Column: name, Found: found[name]})
		}
	}
	return out, nil
}

// probedContentRows is, for each content-keyed table that records tenants,
// the condition on the rows the residue probes look at: not an entry of
// erased content that an erasure does not hide from an unknown reader
// (lethe.is_erased_content), which is another tenant's own use of the text.
func probedContentRows(l Layout) map[Table]string {
	out := map[Table]string{}
	for _, idx := range l.ContentIndexes {
		if idx.TenantColumn != "" {
			out[idx.Table] = `(NOT lethe.is_erased_content(` + idx.Ident() + `) OR lethe.is_erased_content(` +
				idx.Ident() + `, ` + idx.Tenants(idx.Table.Ident()) + `, NULL))`
		}
	}
	return out
}

// vectors converts embeddings to pgvector's type, at the edge.
func vectors(es []erasure.Embedding) []pgvector.Vector {
	out := make([]pgvector.Vector, len(es))
	for i, e := range es {
		out[i] = pgvector.NewVector(e)
	}
	return out
}

// vectorColumns are the database's vector columns now. Under a catalog
// epoch they are read once and shared through the memo: a column added
// since is DDL, which moves the epoch (read now, not when the pass began:
// a copy table created while the pass deleted is probed).
func (e *Eraser) vectorColumns(ctx context.Context) ([]vectorColumn, error) {
	epoch := readEpoch(ctx, e.Pool)
	m := e.memo()
	if epoch != "" {
		m.mu.Lock()
		m.forPool(e.Pool)
		cols, ok := m.vectors, m.vectorsEpoch == epoch
		m.mu.Unlock()
		if ok {
			return cols, nil
		}
	}
	cols, err := readVectorColumns(ctx, e.Pool)
	if err != nil || epoch == "" {
		return cols, err
	}
	m.mu.Lock()
	m.forPool(e.Pool)
	m.vectors, m.vectorsEpoch = cols, epoch
	m.mu.Unlock()
	return cols, nil
}

func readVectorColumns(ctx context.Context, q Querier) ([]vectorColumn, error) {
	rows, err := q.Query(ctx, vectorColumnsSQL)
	if err != nil {
		return nil, fmt.Errorf("list vector columns: %w", err)
	}
	var cols []vectorColumn
	var c vectorColumn
	if _, err := pgx.ForEachRow(rows, []any{&c.col.Table.Schema, &c.col.Table.Name, &c.col.Column, &c.dims}, func() error {
		cols = append(cols, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list vector columns: %w", err)
	}
	return cols, nil
}

// nearCopiesSQL counts the vectors of the array $1 (vectors in their text
// form: pgx has no encoding for an array of vectors) that have a vector of
// c within the cosine distance $2 on a row meeting the condition where (""
// for every row). One statement for the whole sample: each vector is one
// nearest-neighbour lookup (the column's index, when it has one), planned
// once. The distance is a condition of the lookup, not only of its
// result: where may be costly (a ledger lookup per row), and the planner
// tests the cheaper condition first, so where is asked only of rows as
// near as a copy, whether the plan walks the index or scans the table.
func nearCopiesSQL(c QColumn, where string) string {
	if where != "" {
		where = ` AND ` + where
	}
	return `SELECT count(*) FROM unnest($1::text[]::vector[]) AS p(v)
		CROSS JOIN LATERAL (SELECT ` + c.Ident() + ` <=> p.v AS d FROM ` + c.Table.Ident() +
		` WHERE ` + c.Ident() + ` IS NOT NULL AND ` + c.Ident() + ` <=> p.v <= $2` + where +
		` ORDER BY ` + c.Ident() + ` <=> p.v LIMIT 1) n`
}

// queueNearCopies queues sql (a nearCopiesSQL) with the probe vectors of
// c's dimensions; near is called with how many have a copy in c closer
// than maxDistance.
func queueNearCopies(p *pipeline, c vectorColumn, sql string, probe []pgvector.Vector, maxDistance float64, near func(int64)) {
	var vs []string
	for _, v := range probe {
		if c.dims <= 0 || c.dims == len(v.Slice()) {
			vs = append(vs, v.String())
		}
	}
	if len(vs) == 0 {
		return
	}
	p.queryRow("probe "+c.col.String(), sql, []any{vs, maxDistance}, func(row pgx.Row) error {
		var n int64
		err := row.Scan(&n)
		near(n)
		return err
	})
}
