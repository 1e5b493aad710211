package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StepGraph is the receipt step of the graph prune, one receipt per batch.
const StepGraph = "GraphReconciled"

// ErasedSessions returns the sessions this request erased, sorted. The
// graph step prunes exactly these: the sessions of the store's tenant that
// the request found and deleted, never the IDs as requested.
func (e *Eraser) ErasedSessions(ctx context.Context, uid string) ([]string, error) {
	rows, err := e.Pool.Query(ctx, `SELECT record_id FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL ORDER BY record_id`, uid)
	if err != nil {
		return nil, fmt.Errorf("read erased sessions: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read erased sessions: %w", err)
	}
	return ids, nil
}

// DeletedAt is when this request's deletion last committed (the latest
// erased_at of its sessions, by the database's clock); zero when it erased
// nothing. Backups started before it may hold the erased sessions.
func (e *Eraser) DeletedAt(ctx context.Context, uid string) (time.Time, error) {
	var t *time.Time
	if err := e.Pool.QueryRow(ctx, `SELECT max(erased_at) FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL`, uid).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the deletion time: %w", err)
	}
	if t == nil {
		return time.Time{}, nil
	}
	return *t, nil
}

// StepReceipt is one receipt row of a step.
type StepReceipt struct {
	Batch    int
	Sessions int
	Counts   map[string]int64
}

// Receipts returns the receipts of one step of a request, by batch.
func (e *Eraser) Receipts(ctx context.Context, uid, step string) (map[int]StepReceipt, error) {
	rows, err := e.Pool.Query(ctx, `SELECT batch, sessions, counts FROM lethe.erasure_receipts
		WHERE request_uid = $1 AND step = $2`, uid, step)
	if err != nil {
		return nil, fmt.Errorf("read %s receipts: %w", step, err)
	}
	defer rows.Close()
	out := map[int]StepReceipt{}
	for rows.Next() {
		var r StepReceipt
		var raw []byte
		if err := rows.Scan(&r.Batch, &r.Sessions, &raw); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &r.Counts); err != nil {
			return nil, fmt.Errorf("read %s receipt %d: %w", step, r.Batch, err)
		}
		out[r.Batch] = r
	}
	return out, rows.Err()
}

// WriteReceipt records a step done outside Postgres (the graph), once per
// (request, step, batch): a repeat keeps the first receipt.
func (e *Eraser) WriteReceipt(ctx context.Context, uid, step string, batch, sessions int, counts []Count, digest string) error {
	return pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		return writeReceipt(ctx, tx, uid, step, batch, sessions, counts, digest)
	})
}

// GraphSource answers the graph sweep's question — which provenance still
// exists — from the memory tables. Tombstoned sessions still exist: a
// cancel can bring them back.
type GraphSource struct {
	Pool Querier
	// Schema of the memory tables (e.g. "memory").
	Schema string
}

// MissingSessions returns the IDs with no row in <schema>.sessions.
func (s GraphSource) MissingSessions(ctx context.Context, ids []string) ([]string, error) {
	return missing[string](ctx, s.Pool, pgx.Identifier{s.Schema, "sessions"}.Sanitize(), "uuid", ids)
}

// MissingFacts returns the IDs with no row in <schema>.facts.
func (s GraphSource) MissingFacts(ctx context.Context, ids []int64) ([]int64, error) {
	return missing[int64](ctx, s.Pool, pgx.Identifier{s.Schema, "facts"}.Sanitize(), "bigint", ids)
}

func missing[T any](ctx context.Context, q Querier, table, typ string, ids []T) ([]T, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT x FROM unnest($1::`+typ+`[]) AS x
		WHERE NOT EXISTS (SELECT 1 FROM `+table+` t WHERE t.id = x)`, ids)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", table, err)
	}
	return out, nil
}
