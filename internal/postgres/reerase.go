package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// resurrectedSQL finds, and locks, the sessions of the tenant $2 (NULL:
// any) that the request $1 erased and that exist again.
func resurrectedSQL(l Layout) string {
	return `SELECT s.id::text FROM lethe.erasure_ledger l
		JOIN ` + l.Sessions.Ident() + ` s ON s.id = l.record_id::uuid
		WHERE l.scope = 'session' AND l.request_uid = $1 AND l.erased_at IS NOT NULL
		  AND ($2::text IS NULL OR s.tenant_id = $2)
		ORDER BY s.id FOR UPDATE OF l, s`
}

// Reerase finds sessions this request erased that exist again (a restored
// backup) and erases them at once — the grace period was served the first
// time — writing the Resurrected receipt under the next free batch key of
// the request, chosen in the same transaction (the result's Batch). It
// returns a Skipped result with Sessions == 0 when nothing came back.
func (e *Eraser) Reerase(ctx context.Context, uid string) (erasure.BatchResult, error) {
	var res erasure.BatchResult
	err := e.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx, l Layout) error {
		back, err := collectStrings(ctx, tx, resurrectedSQL(l), uid, e.tenant())
		if err != nil {
			return fmt.Errorf("look for resurrected sessions: %w", err)
		}
		if len(back) == 0 {
			res.Skipped = true
			return nil
		}
		// Hidden from the application at once, in case the delete fails.
		if _, err := tx.Exec(ctx, tombstoneSQL(l), back, uid); err != nil {
			return fmt.Errorf("tombstone resurrected sessions: %w", err)
		}
		if _, err := eraseLocked(ctx, tx, l, uid, back, 0, &res); err != nil {
			return err
		}
		r := receipt{uid: uid, step: erasure.StepResurrected, sessions: res.Sessions, counts: res.Rows}
		_, err = appendReceipt(ctx, tx, r, func(batch int) any {
			res.Batch = batch
			return res
		})
		return err
	})
	return res, err
}
