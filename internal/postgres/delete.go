package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgvector/pgvector-go"
)

// BatchResult is what one deletion batch did.
type BatchResult struct {
	Batch    int
	Sessions int
	// Rows removed per table (counted in the transaction before the delete;
	// the cascade removes the children with the sessions).
	Rows                []Count
	ContentIndexEntries int64
	DerivedRecords      int64
	DeletedAt           time.Time
	// Skipped is true when the batch had nothing eligible (already done,
	// cancelled, or not yet past its grace period).
	Skipped bool
}

// DeleteResult is what the whole deletion did.
type DeleteResult struct {
	Batches []BatchResult
	// Probe holds a bounded sample of the erased embeddings, read inside the
	// transactions and kept in memory only, for the residue probe.
	Probe []pgvector.Vector
	// CommitLSN is the WAL position after the last commit (for replicas).
	CommitLSN string
}

// Delete erases the request's sessions in batches of batchSize, one
// transaction each. Each transaction re-checks the ledger — not cancelled,
// grace elapsed by the database's clock, tenant — removes content-index
// entries and derived records of the sessions, deletes the sessions (the
// cascade takes the rest), marks the ledger erased and writes the receipt
// for (request, Deleted, batch). A repeat skips the batches already done.
func (e *Eraser) Delete(ctx context.Context, req Request, batchSize, probeBudget int, digest func(BatchResult) (string, error)) (DeleteResult, error) {
	var out DeleteResult
	ids := slices.Clone(req.SessionIDs)
	slices.Sort(ids)
	for b, start := 0, 0; start < len(ids); b, start = b+1, start+batchSize {
		batch := ids[start:min(start+batchSize, len(ids))]
		res, probe, err := e.deleteBatch(ctx, req.UID, b, batch, probeBudget-len(out.Probe), digest)
		if err != nil {
			return out, fmt.Errorf("batch %d: %w", b, err)
		}
		out.Batches = append(out.Batches, res)
		out.Probe = append(out.Probe, probe...)
	}
	if err := e.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&out.CommitLSN); err != nil {
		return out, fmt.Errorf("read WAL position: %w", err)
	}
	return out, nil
}

func (e *Eraser) deleteBatch(ctx context.Context, uid string, batch int, ids []string, probeBudget int,
	digest func(BatchResult) (string, error)) (BatchResult, []pgvector.Vector, error) {
	res := BatchResult{Batch: batch}
	var probe []pgvector.Vector
	err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		layout, err := e.layout(ctx, tx)
		if err != nil {
			return err
		}
		// The guard: only sessions this request holds tombstoned, not
		// cancelled, not yet erased, past the grace period by the database's
		// clock, and of the store's tenant. Locks both rows.
		// Two steps, each on its table's key, so that no plan (generic or
		// custom) walks the tombstoned sessions: the ledger rows first, then
		// the sessions they name.
		rows, err := tx.Query(ctx, `WITH l AS MATERIALIZED (
				SELECT record_id FROM lethe.erasure_ledger
				WHERE request_uid = $1 AND scope = 'session' AND record_id = ANY($2::text[])
				  AND cancelled_at IS NULL AND erased_at IS NULL AND grace_ends_at <= now()
				FOR UPDATE)
			SELECT s.id::text FROM `+layout.Sessions.Ident()+` s
			WHERE s.id = ANY(ARRAY(SELECT record_id::uuid FROM l))
			  AND s.tombstoned_at IS NOT NULL AND ($3::text IS NULL OR s.tenant_id = $3)
			ORDER BY s.id FOR UPDATE`, uid, ids, e.tenant())
		if err != nil {
			return fmt.Errorf("check ledger: %w", err)
		}
		eligible, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("check ledger: %w", err)
		}
		if len(eligible) == 0 {
			res.Skipped = true
			return tx.QueryRow(ctx, `SELECT now()`).Scan(&res.DeletedAt)
		}
		if err := e.eraseLocked(ctx, tx, layout, uid, eligible, probeBudget, &res, &probe); err != nil {
			return err
		}
		d, err := digest(res)
		if err != nil {
			return err
		}
		return writeReceipt(ctx, tx, uid, StepDeleted, batch, res.Sessions, res.Rows, d)
	})
	if err != nil {
		return res, nil, err
	}
	return res, probe, nil
}

// eraseLocked removes the eligible sessions (already locked by the caller's
// guard query) and everything reached from them: content-index entries,
// derived records, the sessions and, by cascade, their rows. The statements
// go in one pipelined batch: one round trip to the database.
func (e *Eraser) eraseLocked(ctx context.Context, tx pgx.Tx, layout Layout, uid string, eligible []string, probeBudget int,
	res *BatchResult, probe *[]pgvector.Vector) error {
	res.Sessions = len(eligible)
	keyOf := func(t Table) string { return pgx.Identifier{layout.sessionKey(t)}.Sanitize() }
	tables := append([]Table{layout.Sessions}, layout.Children...)

	b := &pgx.Batch{}

	// 2. A bounded sample of the embeddings for the residue probe.
	sample := probeBudget > len(*probe) && len(layout.Vectors) > 0
	if sample {
		var sel []string
		for _, v := range layout.Vectors {
			sel = append(sel, `(SELECT `+v.Ident()+`::vector FROM `+v.Table.Ident()+` WHERE `+keyOf(v.Table)+` = ANY($1::uuid[]) AND `+v.Ident()+` IS NOT NULL LIMIT $2)`)
		}
		b.Queue(`SELECT * FROM (`+strings.Join(sel, " UNION ALL ")+`) s LIMIT $2`, eligible, probeBudget-len(*probe))
	}

	// 3. Content-keyed index entries of the sessions' content. Their ledger
	// rows keep hiding the hashes (lethe.is_erased) and are not marked one by
	// one: that cost more than the cascade itself; the receipt counts them.
	var hashSel []string
	for _, src := range layout.ContentSources {
		hashSel = append(hashSel, `SELECT `+src.Ident()+` FROM `+src.Table.Ident()+` WHERE `+keyOf(src.Table)+` = ANY($1::uuid[])`)
	}
	hashes := ""
	if len(hashSel) > 0 {
		hashes = `SELECT h FROM (` + strings.Join(hashSel, " UNION ") + `) x(h) WHERE h IS NOT NULL`
		for _, idx := range layout.ContentIndexes {
			b.Queue(`DELETE FROM `+idx.Table.Ident()+` WHERE `+idx.Ident()+` IN (`+hashes+`)`, eligible)
		}
	}

	// 4. Derived records whose lineage names a session (their lineage goes with them).
	for _, lin := range layout.Lineages {
		b.Queue(`WITH l AS (DELETE FROM `+lin.Table.Ident()+` WHERE `+lin.SourceMatch(1)+`
				RETURNING `+pgx.Identifier{lin.DerivedColumn}.Sanitize()+` AS d)
			DELETE FROM `+lin.Derived.Ident()+` WHERE `+pgx.Identifier{lin.DerivedKey}.Sanitize()+` IN (SELECT d FROM l)`, eligible)
	}

	// 5. The sessions: the cascade removes the children. Then what was
	// actually deleted, per table, from this transaction's own statistics
	// counters (they include the cascade, and cost no second scan). 6. The ledger.
	b.Queue(`DELETE FROM `+layout.Sessions.Ident()+` WHERE id = ANY($1::uuid[])`, eligible)
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.Ident()
	}
	b.Queue(`SELECT array_agg(pg_stat_get_xact_tuples_deleted(to_regclass(t)) ORDER BY o)
		FROM unnest($1::text[]) WITH ORDINALITY u(t, o)`, names)
	b.Queue(`WITH u AS (UPDATE lethe.erasure_ledger SET erased_at = now()
			WHERE request_uid = $1 AND scope = 'session' AND record_id = ANY($2::text[]) RETURNING 1)
		SELECT now(), count(*) FROM u`, uid, eligible)

	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if sample {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("sample embeddings: %w", err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[pgvector.Vector])
		if err != nil {
			return fmt.Errorf("sample embeddings: %w", err)
		}
		*probe = append(*probe, vs...)
	}
	if hashes != "" {
		for _, idx := range layout.ContentIndexes {
			tag, err := br.Exec()
			if err != nil {
				return fmt.Errorf("delete from %s: %w", idx.Table, err)
			}
			res.ContentIndexEntries += tag.RowsAffected()
		}
	}
	for _, lin := range layout.Lineages {
		tag, err := br.Exec()
		if err != nil {
			return fmt.Errorf("delete derived records of %s: %w", lin.Derived, err)
		}
		res.DerivedRecords += tag.RowsAffected()
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("delete sessions: %w", err)
	}
	if tag.RowsAffected() != int64(len(eligible)) {
		return fmt.Errorf("deleted %d sessions, expected %d: rolled back", tag.RowsAffected(), len(eligible))
	}
	var deleted []int64
	if err := br.QueryRow().Scan(&deleted); err != nil {
		return fmt.Errorf("read deletion counters: %w", err)
	}
	for i, t := range tables {
		res.Rows = append(res.Rows, Count{Table: t.String(), Rows: deleted[i]})
	}
	var marked int64
	if err := br.QueryRow().Scan(&res.DeletedAt, &marked); err != nil {
		return fmt.Errorf("mark sessions erased: %w", err)
	}
	return br.Close()
}

// Verification is one "nothing left" check.
type Verification struct {
	Check string
	Found int64
}

// Verify looks for anything left of the sessions the request erased (by the
// ledger): rows in sessions and every cascading table, content-index entries
// of their content, lineage rows.
func (e *Eraser) Verify(ctx context.Context, uid string) ([]Verification, error) {
	var out []Verification
	err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		layout, err := e.layout(ctx, tx)
		if err != nil {
			return err
		}
		idRows, err := tx.Query(ctx, `SELECT record_id FROM lethe.erasure_ledger
			WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL`, uid)
		if err != nil {
			return fmt.Errorf("read ledger: %w", err)
		}
		ids, err := pgx.CollectRows(idRows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read ledger: %w", err)
		}
		for _, t := range append([]Table{layout.Sessions}, layout.Children...) {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+t.Ident()+` WHERE `+pgx.Identifier{layout.sessionKey(t)}.Sanitize()+` = ANY($1::uuid[])`, ids).Scan(&n); err != nil {
				return fmt.Errorf("verify %s: %w", t, err)
			}
			out = append(out, Verification{Check: "rows of the sessions in " + t.String(), Found: n})
		}
		rows, err := tx.Query(ctx, `SELECT record_id FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'content'`, uid)
		if err != nil {
			return fmt.Errorf("read content ledger: %w", err)
		}
		hashes, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read content ledger: %w", err)
		}
		for _, idx := range layout.ContentIndexes {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+idx.Table.Ident()+` WHERE `+idx.Ident()+` = ANY($1::text[])`, hashes).Scan(&n); err != nil {
				return fmt.Errorf("verify %s: %w", idx.Table, err)
			}
			out = append(out, Verification{Check: "content-keyed entries in " + idx.Table.String(), Found: n})
		}
		for _, lin := range layout.Lineages {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+lin.Table.Ident()+` WHERE `+lin.SourceMatch(1), ids).Scan(&n); err != nil {
				return fmt.Errorf("verify %s: %w", lin.Table, err)
			}
			out = append(out, Verification{Check: "derived records via " + lin.Table.String(), Found: n})
		}
		return nil
	})
	return out, err
}

// Residue is a near-identical copy of an erased embedding found after deletion.
type Residue struct {
	Column QColumn
	Found  int64
}

// ProbeResidue runs a nearest-neighbour query with each probe vector against
// every vector column of matching dimension outside the cascade (every
// schema) and reports the columns holding a near-identical vector (cosine
// distance below maxDistance): a copy that the cascade missed. Columns on
// sessions and the tables cascading from it are skipped: a vector there sits
// on a row of a live session (the same text said in another session is that
// session's own data, not residue).
func (e *Eraser) ProbeResidue(ctx context.Context, probe []pgvector.Vector, maxDistance float64) ([]Residue, error) {
	if len(probe) == 0 {
		return nil, nil
	}
	layout, err := e.layout(ctx, e.Pool)
	if err != nil {
		return nil, err
	}
	cascade := map[Table]bool{layout.Sessions: true}
	for _, t := range layout.Children {
		cascade[t] = true
	}
	type col struct {
		c    QColumn
		dims int
	}
	rows, err := e.Pool.Query(ctx, `SELECT n.nspname, c.relname, a.attname, a.atttypmod
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_type t ON t.oid = a.atttypid
		WHERE t.typname = 'vector' AND c.relkind IN ('r', 'p') AND NOT a.attisdropped
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2, 3`)
	if err != nil {
		return nil, fmt.Errorf("list vector columns: %w", err)
	}
	var cols []col
	var c col
	if _, err := pgx.ForEachRow(rows, []any{&c.c.Table.Schema, &c.c.Table.Name, &c.c.Column, &c.dims}, func() error {
		cols = append(cols, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list vector columns: %w", err)
	}
	var out []Residue
	for _, c := range cols {
		if cascade[c.c.Table] {
			continue
		}
		var found int64
		for _, v := range probe {
			if c.dims > 0 && c.dims != len(v.Slice()) {
				continue
			}
			var d *float64
			if err := e.Pool.QueryRow(ctx, `SELECT `+c.c.Ident()+` <=> $1 FROM `+c.c.Table.Ident()+
				` WHERE `+c.c.Ident()+` IS NOT NULL ORDER BY `+c.c.Ident()+` <=> $1 LIMIT 1`, v).Scan(&d); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return nil, fmt.Errorf("probe %s: %w", c.c, err)
			}
			if d != nil && *d <= maxDistance {
				found++
			}
		}
		if found > 0 {
			out = append(out, Residue{Column: c.c, Found: found})
		}
	}
	return out, nil
}

// Reerase finds sessions this request erased that exist again (a restored
// backup) and erases them at once — the grace period was served the first
// time — writing the receipt (request, Resurrected, batch). It returns a
// result with Sessions == 0 when nothing came back.
func (e *Eraser) Reerase(ctx context.Context, uid string, batch int, digest func(BatchResult) (string, error)) (BatchResult, error) {
	res := BatchResult{Batch: batch}
	err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		layout, err := e.layout(ctx, tx)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT s.id::text FROM lethe.erasure_ledger l
			JOIN `+layout.Sessions.Ident()+` s ON s.id = l.record_id::uuid
			WHERE l.scope = 'session' AND l.request_uid = $1 AND l.erased_at IS NOT NULL
			  AND ($2::text IS NULL OR s.tenant_id = $2)
			ORDER BY s.id FOR UPDATE OF l, s`, uid, e.tenant())
		if err != nil {
			return fmt.Errorf("look for resurrected sessions: %w", err)
		}
		back, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("look for resurrected sessions: %w", err)
		}
		if len(back) == 0 {
			res.Skipped = true
			return nil
		}
		// Hidden from the application at once, in case the delete fails.
		if _, err := tx.Exec(ctx, `UPDATE `+layout.Sessions.Ident()+` SET tombstoned_at = now(), tombstoned_by = $2
			WHERE id = ANY($1::uuid[]) AND tombstoned_at IS NULL`, back, uid); err != nil {
			return fmt.Errorf("tombstone resurrected sessions: %w", err)
		}
		var probe []pgvector.Vector
		if err := e.eraseLocked(ctx, tx, layout, uid, back, 0, &res, &probe); err != nil {
			return err
		}
		d, err := digest(res)
		if err != nil {
			return err
		}
		return writeReceipt(ctx, tx, uid, StepResurrected, batch, res.Sessions, res.Rows, d)
	})
	return res, err
}

// ReplicaCaughtUp reports whether the replica behind pool has replayed past lsn.
func ReplicaCaughtUp(ctx context.Context, q Querier, lsn string) (bool, error) {
	var ok *bool
	if err := q.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&ok); err != nil {
		return false, fmt.Errorf("read replay position: %w", err)
	}
	if ok == nil {
		return false, fmt.Errorf("the server is not a replica (pg_last_wal_replay_lsn() is null)")
	}
	return *ok, nil
}
