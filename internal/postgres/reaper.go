package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// heldTombstonesSQL lists, per request, the sessions of the tenant $1
// (NULL: any) it holds tombstoned and not erased nor cancelled, whose first
// tombstone is older than $2 seconds, and whether it erased any session
// already (the deletion started).
const heldTombstonesSQL = `SELECT request_uid, array_agg(record_id ORDER BY record_id) FILTER (WHERE erased_at IS NULL),
		bool_or(erased_at IS NOT NULL)
	FROM lethe.erasure_ledger
	WHERE scope = 'session' AND cancelled_at IS NULL AND ($1::text IS NULL OR tenant_id = $1)
	GROUP BY request_uid
	HAVING bool_or(erased_at IS NULL) AND min(tombstoned_at) < now() - make_interval(secs => $2)
	ORDER BY request_uid`

// HeldTombstones lists the requests holding sessions of the store's tenant
// tombstoned, first tombstoned more than minAge ago (by the database's
// clock). Read only.
func (e *Eraser) HeldTombstones(ctx context.Context, minAge time.Duration) ([]erasure.TombstoneHold, error) {
	rows, err := e.Pool.Query(ctx, heldTombstonesSQL, e.tenant(), minAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("list held tombstones: %w", err)
	}
	var out []erasure.TombstoneHold
	var h erasure.TombstoneHold
	_, err = pgx.ForEachRow(rows, []any{&h.UID, &h.SessionIDs, &h.Started}, func() error {
		out = append(out, h)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list held tombstones: %w", err)
	}
	return out, nil
}

// TombstonedSessions counts the store's sessions (of its tenant) that are tombstoned.
func (e *Eraser) TombstonedSessions(ctx context.Context) (int64, error) {
	var n int64
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM `+l.Sessions.Ident()+
			` WHERE tombstoned_at IS NOT NULL AND ($1::text IS NULL OR tenant_id = $1)`, e.tenant()).Scan(&n)
	})
	return n, err
}
