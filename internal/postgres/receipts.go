package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// Receipts: one row of lethe.erasure_receipts per (request, step, batch),
// written in the transaction of the work it records. Its digest is
// evidence.Digest of what it records.

// receipt is one receipt row; of is what its digest covers.
type receipt struct {
	uid, step       string
	batch, sessions int
	counts          []erasure.Count
	of              any
}

// receiptInsertSQL writes a receipt unless its (request, step, batch) has one.
const receiptInsertSQL = `INSERT INTO lethe.erasure_receipts (request_uid, step, batch, sessions, counts, digest)
	VALUES ($1, $2, $3, $4, $5::jsonb, $6) ON CONFLICT (request_uid, step, batch) DO NOTHING`

// insert writes the receipt and reports whether it was written (false:
// its batch already had one, which is kept).
func (r receipt) insert(ctx context.Context, tx pgx.Tx) (bool, error) {
	digest, err := evidence.Digest(r.of)
	if err != nil {
		return false, err
	}
	m := map[string]int64{}
	for _, c := range r.counts {
		m[c.Table] = c.Rows
	}
	countsJSON, err := json.Marshal(m)
	if err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, receiptInsertSQL, r.uid, r.step, r.batch, r.sessions, string(countsJSON), digest)
	if err != nil {
		return false, fmt.Errorf("write %s receipt: %w", r.step, err)
	}
	return tag.RowsAffected() == 1, nil
}

// write writes the receipt once: a repeat keeps the first.
func (r receipt) write(ctx context.Context, tx pgx.Tx) error {
	_, err := r.insert(ctx, tx)
	return err
}

const (
	// lockReceiptsSQL serializes, until the transaction ends, the writers
	// that choose the next batch key of a (request $1, step $2).
	lockReceiptsSQL = `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`
	// nextBatchSQL is the next free batch key of a (request $1, step $2).
	nextBatchSQL = `SELECT coalesce(max(batch) + 1, 0) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = $2`
)

// appendAttempts bounds the retries of an append that lost its key to a
// writer that chose it explicitly (WriteReceipt does not take the lock).
const appendAttempts = 5

// appendReceipt writes r under the next free batch key of its (request,
// step) and returns that key. of gives what the digest covers once the key
// is chosen. Concurrent appends take the key one after the other, so none
// is lost.
func appendReceipt(ctx context.Context, tx pgx.Tx, r receipt, of func(batch int) any) (int, error) {
	if _, err := tx.Exec(ctx, lockReceiptsSQL, r.uid, r.step); err != nil {
		return 0, fmt.Errorf("lock %s receipts: %w", r.step, err)
	}
	for range appendAttempts {
		if err := tx.QueryRow(ctx, nextBatchSQL, r.uid, r.step).Scan(&r.batch); err != nil {
			return 0, fmt.Errorf("read %s receipts: %w", r.step, err)
		}
		r.of = of(r.batch)
		if written, err := r.insert(ctx, tx); err != nil || written {
			return r.batch, err
		}
	}
	return 0, fmt.Errorf("write %s receipt: every batch key tried was taken by a concurrent writer", r.step)
}

// receiptsSQL reads the receipts of one step of a request.
const receiptsSQL = `SELECT batch, sessions, counts, recorded_at FROM lethe.erasure_receipts
	WHERE request_uid = $1 AND step = $2`

// Receipts returns the receipts of one step of a request, by batch.
func (e *Eraser) Receipts(ctx context.Context, uid, step string) (map[int]erasure.StepReceipt, error) {
	rows, err := e.Pool.Query(ctx, receiptsSQL, uid, step)
	if err != nil {
		return nil, fmt.Errorf("read %s receipts: %w", step, err)
	}
	out := map[int]erasure.StepReceipt{}
	var r erasure.StepReceipt
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&r.Batch, &r.Sessions, &raw, &r.At}, func() error {
		r.Counts = nil
		if err := json.Unmarshal(raw, &r.Counts); err != nil {
			return fmt.Errorf("read %s receipt %d: %w", step, r.Batch, err)
		}
		out[r.Batch] = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WriteReceipt records batch of a step done outside Postgres (the graph),
// once per (request, step, batch): a repeat keeps the first receipt. The
// digest is that of counts.
func (e *Eraser) WriteReceipt(ctx context.Context, uid, step string, batch, sessions int, counts []erasure.Count) error {
	return pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		return receipt{uid: uid, step: step, batch: batch, sessions: sessions, counts: counts, of: counts}.write(ctx, tx)
	})
}

// AppendReceipt records one more run of a step done outside Postgres under
// the next free batch key of (request, step), in one transaction. The
// digest is that of counts.
func (e *Eraser) AppendReceipt(ctx context.Context, uid, step string, sessions int, counts []erasure.Count) error {
	return pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		r := receipt{uid: uid, step: step, sessions: sessions, counts: counts}
		_, err := appendReceipt(ctx, tx, r, func(int) any { return counts })
		return err
	})
}
