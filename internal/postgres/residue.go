package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// Residue is what the cascade does not reach and may come back after the
// deletion: derived records whose lineage names an erased session (written
// by an owner or a job that bypassed the guard, or restored), and
// content-keyed entries of erased content (re-cached). Re-verification
// removes it, under the sessions' locks, with a receipt.

// residueCountSQL counts the derived records whose lineage names one of
// the sessions $1 ($2, the request, unused): every pass after the deletion
// asks, so it takes index lookups only. Content-keyed entries are not
// counted here — the ledger holds only keyed hashes of their keys, and
// finding them takes a scan — but removed whenever residue is.
func residueCountSQL(l Layout) string {
	parts := []string{"0"}
	for _, lin := range l.Lineages {
		parts = append(parts, `(SELECT count(*) FROM `+lin.Table.Ident()+` WHERE `+lin.SourceMatch(1)+`)`)
	}
	return `SELECT ` + strings.Join(parts, " + ") + ` WHERE $1::text[] IS NOT NULL AND $2::text IS NOT NULL`
}

// purgeContentSQL removes from idx the entries of the content the request
// $1 erased (its keyed ledger rows), for the tenant $2 as the deletion does.
func purgeContentSQL(idx ContentIndex) string {
	return removeContentSQL(idx, `WITH`, `EXISTS (SELECT 1 FROM lethe.erasure_ledger l
		WHERE l.request_uid = $1 AND l.scope = 'content' AND l.cancelled_at IS NULL
		  AND l.record_id = lethe.content_hash(i.`+idx.Ident()+`))`)
}

// residue counts what queuePurge would remove; read only.
func residue(ctx context.Context, q Querier, l Layout, req erasure.Request) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, residueCountSQL(l), req.SessionIDs, req.UID).Scan(&n); err != nil {
		return 0, fmt.Errorf("count residue: %w", err)
	}
	return n, nil
}

// queuePurge removes the residue of the sessions the request erased: the
// derived records their lineage names (with the lineage rows) and the
// content-keyed entries of their content, adding the counts to res.
func queuePurge(p *pipeline, l Layout, req erasure.Request, tenant *string, res *erasure.BatchResult) {
	queueDerivedDeletes(p, l, req.SessionIDs, res)
	for _, idx := range l.ContentIndexes {
		p.queryRow("purge "+idx.Table.String(), purgeContentSQL(idx), []any{req.UID, tenant}, func(row pgx.Row) error {
			var n int64
			err := row.Scan(&n)
			res.ContentIndexEntries += n
			return err
		})
	}
}

// purgeResidue runs queuePurge in tx.
func purgeResidue(ctx context.Context, tx pgx.Tx, l Layout, req erasure.Request, tenant *string, res *erasure.BatchResult) error {
	var p pipeline
	queuePurge(&p, l, req, tenant, res)
	if len(p.names) == 0 {
		return nil
	}
	return p.send(ctx, tx)
}

// erasedOfSQL is, of the sessions $1, those the request $2 holds erased.
const erasedOfSQL = `SELECT record_id FROM lethe.erasure_ledger
	WHERE request_uid = $2 AND scope = 'session' AND record_id = ANY($1::text[]) AND erased_at IS NOT NULL ORDER BY 1`

// RemoveResidue removes the residue of the sessions of req that the request
// holds erased — derived records their lineage names, content-keyed entries
// of their content — under the sessions' locks (a derivation in flight
// commits first), with a ResidueRemoved receipt under the next free batch
// key. Nothing to remove: a Skipped result. Sessions not erased are left
// alone: removing what derives from a live session is not this request's.
func (e *Eraser) RemoveResidue(ctx context.Context, req erasure.Request) (erasure.BatchResult, error) {
	res := erasure.BatchResult{Skipped: true}
	err := e.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx, l Layout) error {
		erased, err := collectStrings(ctx, tx, erasedOfSQL, req.SessionIDs, req.UID)
		if err != nil || len(erased) == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, lockSessionsSQL, erased); err != nil {
			return fmt.Errorf("wait for derivations in flight: %w", err)
		}
		if err := purgeResidue(ctx, tx, l, erasure.Request{UID: req.UID, SessionIDs: erased}, e.tenant(), &res); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, nowSQL).Scan(&res.DeletedAt); err != nil {
			return err
		}
		if res.DerivedRecords == 0 && res.ContentIndexEntries == 0 {
			return nil
		}
		res.Skipped = false
		counts := []erasure.Count{
			{Table: erasure.CountContentIndexEntries, Rows: res.ContentIndexEntries},
			{Table: erasure.CountDerivedRecords, Rows: res.DerivedRecords}}
		_, err = appendReceipt(ctx, tx, receipt{uid: req.UID, step: erasure.StepResidueRemoved, counts: counts}, func(batch int) any {
			res.Batch = batch
			return res
		})
		return err
	})
	if err != nil || res.Skipped {
		return res, err
	}
	// Read after the commit: the replicas no longer hold the residue once
	// they replay past it.
	if err := e.Pool.QueryRow(ctx, walPositionSQL).Scan(&res.CommitLSN); err != nil {
		return res, fmt.Errorf("read WAL position: %w", err)
	}
	return res, nil
}
