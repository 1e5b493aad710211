package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// The ledger lives in the database it protects: a restore of that database
// (a pg_dump, a volume snapshot) takes the ledger back with the sessions.
// Re-erasure therefore starts from what the request found, as the API
// server keeps it, not from the ledger.

const (
	// restoreLedgerSQL re-creates the session ledger rows of the request $2
	// that a restore took away (tenant $3), grace served; it returns how
	// many it wrote.
	restoreLedgerSQL = `WITH i AS (
		INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at)
		SELECT 'session', r, $2, $3, now(), now() FROM unnest($1::text[]) AS r
		ON CONFLICT DO NOTHING RETURNING 1)
		SELECT count(*) FROM i`
	// unerasedLedgerSQL counts the request's session ledger rows for $2 not
	// marked erased (a restore of a snapshot taken before the deletion).
	unerasedLedgerSQL = `SELECT count(*) FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'session' AND record_id = ANY($2::text[]) AND erased_at IS NULL AND cancelled_at IS NULL`
	// markGoneErasedSQL marks erased the request's session rows for $2
	// whose session does not exist (they were erased before the restore).
	markGoneErasedSQL = `UPDATE lethe.erasure_ledger SET erased_at = clock_timestamp()
		WHERE request_uid = $1 AND scope = 'session' AND record_id = ANY($2::text[]) AND erased_at IS NULL AND cancelled_at IS NULL`
)

// Reerase erases again, at once, the sessions req names (those the request
// found and erased) that exist again, puts back in force the ledger rows a
// restore took away or left un-erased — so that the lineage guard and the
// row-level security refuse them again — and removes the residue of the
// sessions (derived records, content-keyed entries) that came back, all in
// one transaction, writing the Resurrected receipt under the next free
// batch key (the result's Batch). Nothing came back: a Skipped result.
func (e *Eraser) Reerase(ctx context.Context, req erasure.Request) (erasure.BatchResult, error) {
	res := erasure.BatchResult{Skipped: true}
	// Every pass after the deletion asks: one read-only transaction answers
	// the common case, nothing came back, without taking a lock.
	if lost, err := e.lost(ctx, req); err != nil || !lost {
		return res, err
	}
	err := auditAttempts(ctx, func(settle bool) error {
		var err error
		res, err = e.reeraseOnce(ctx, req, settle)
		return err
	})
	if err != nil || res.Skipped {
		return res, err
	}
	// Read after the commit: a replica past it no longer serves what came
	// back. The sessions erased again are dated past the commit first, as a
	// deletion's are (positionErasedSQL); the receipt keeps its own time.
	res.CommitLSN, _, err = e.positionErased(ctx, req.UID)
	return res, err
}

// Position reads the primary's WAL position now.
func (e *Eraser) Position(ctx context.Context) (string, error) {
	var lsn string
	if err := e.Pool.QueryRow(ctx, walPositionSQL).Scan(&lsn); err != nil {
		return "", fmt.Errorf("read WAL position: %w", err)
	}
	return lsn, nil
}

// reeraseOnce is one transaction of Reerase. As the deletion's long way:
// the schema audited, the layout the one the audited catalog gives (the
// pass may have read it while a restore was still adding the keys), and
// the epoch it was audited under checked again at the end.
func (e *Eraser) reeraseOnce(ctx context.Context, req erasure.Request, settle bool) (erasure.BatchResult, error) {
	res := erasure.BatchResult{}
	err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		l, epoch, err := e.auditedLayout(ctx, tx, settle)
		if err != nil {
			return err
		}
		back, err := collectStrings(ctx, tx, findSessionsSQL(l, true), req.SessionIDs, e.tenant())
		if err != nil {
			return fmt.Errorf("look for resurrected sessions: %w", err)
		}
		if err := e.restoreLedger(ctx, tx, l, req, back, &res); err != nil {
			return err
		}
		// A derivation in flight from one of the sessions commits first.
		if _, err := tx.Exec(ctx, lockSessionsSQL, req.SessionIDs); err != nil {
			return fmt.Errorf("wait for derivations in flight: %w", err)
		}
		if err := e.eraseBack(ctx, tx, l, req.UID, back, &res); err != nil {
			return err
		}
		if err := purgeResidue(ctx, tx, l, req, e.tenant(), &res); err != nil {
			return err
		}
		if settle {
			epoch = "" // the last attempt goes on (auditAttempts)
		}
		return e.finishReerase(ctx, tx, req.UID, epoch, &res)
	})
	return res, err
}

// finishReerase dates the re-erasure, checks the epoch it audited under
// ("" none) once more, and writes the receipt unless nothing came back.
func (e *Eraser) finishReerase(ctx context.Context, tx pgx.Tx, uid, epoch string, res *erasure.BatchResult) error {
	if err := tx.QueryRow(ctx, nowSQL).Scan(&res.DeletedAt); err != nil {
		return err
	}
	if epoch != "" {
		var ok bool
		if err := tx.QueryRow(ctx, epochStillSQL, epoch).Scan(&ok); err != nil {
			return err
		}
	}
	if res.Sessions == 0 && res.LedgerRowsRestored == 0 && res.DerivedRecords == 0 && res.ContentIndexEntries == 0 {
		res.Skipped = true
		return nil
	}
	return e.resurrectedReceipt(ctx, tx, uid, res)
}

// eraseBack tombstones the sessions that came back — hidden from the
// application at once, in case the delete fails — and erases them.
func (e *Eraser) eraseBack(ctx context.Context, tx pgx.Tx, l Layout, uid string, back []string, res *erasure.BatchResult) error {
	if len(back) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, tombstoneSQL(l), back, uid); err != nil {
		return fmt.Errorf("tombstone resurrected sessions: %w", err)
	}
	var p pipeline
	queueErase(&p, l, uid, back, e.tenant(), sampleBudget{}, res, eraseChecks{})
	return p.send(ctx, tx)
}

// lost reports, read only, whether anything of req came back: sessions,
// ledger rows gone or un-erased, or residue.
func (e *Eraser) lost(ctx context.Context, req erasure.Request) (bool, error) {
	var lost bool
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		findings, err := e.intact(ctx, tx, l, []erasure.Request{req})
		if err != nil || len(findings) > 0 {
			lost = len(findings) > 0
			return err
		}
		n, err := residue(ctx, tx, l, req)
		lost = n > 0
		return err
	})
	return lost, err
}

// resurrectedReceipt records the re-erasure, its counts those the evidence reports.
func (e *Eraser) resurrectedReceipt(ctx context.Context, tx pgx.Tx, uid string, res *erasure.BatchResult) error {
	counts := append(slices.Clone(res.Rows),
		erasure.Count{Table: erasure.CountContentIndexEntries, Rows: res.ContentIndexEntries},
		erasure.Count{Table: erasure.CountDerivedRecords, Rows: res.DerivedRecords},
		erasure.Count{Table: erasure.CountLedgerRowsPutBack, Rows: res.LedgerRowsRestored})
	r := receipt{uid: uid, step: erasure.StepResurrected, sessions: res.Sessions, counts: counts}
	_, err := appendReceipt(ctx, tx, r, func(batch int) any {
		res.Batch = batch
		return *res
	})
	return err
}

// restoreLedger writes back the ledger rows of req a restore took away (the
// sessions, and the keyed hashes of the content of those that came back) and
// counts them, with the rows left un-erased, in res.LedgerRowsRestored.
// Rows of sessions that did not come back are marked erased at once.
func (e *Eraser) restoreLedger(ctx context.Context, tx pgx.Tx, l Layout, req erasure.Request, back []string, res *erasure.BatchResult) error {
	var unerased, written int64
	if err := tx.QueryRow(ctx, unerasedLedgerSQL, req.UID, req.SessionIDs).Scan(&unerased); err != nil {
		return fmt.Errorf("read ledger: %w", err)
	}
	if err := tx.QueryRow(ctx, restoreLedgerSQL, req.SessionIDs, req.UID, e.tenant()).Scan(&written); err != nil {
		return fmt.Errorf("restore ledger: %w", err)
	}
	res.LedgerRowsRestored = unerased + written
	if err := e.writeContent(ctx, tx, l, erasure.Request{UID: req.UID}, back); err != nil {
		return err
	}
	if err := e.writeSources(ctx, tx, l, erasure.Request{UID: req.UID}, back); err != nil {
		return err
	}
	gone := make([]string, 0, len(req.SessionIDs))
	for _, id := range req.SessionIDs {
		if !slices.Contains(back, id) {
			gone = append(gone, id)
		}
	}
	if _, err := tx.Exec(ctx, markGoneErasedSQL, req.UID, gone); err != nil {
		return fmt.Errorf("mark ledger erased: %w", err)
	}
	return nil
}
