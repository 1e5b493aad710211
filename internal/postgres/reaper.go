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

// heldBySQL counts the ledger rows in force (not erased, not cancelled) of
// the request $1.
const heldBySQL = `SELECT count(*) FROM lethe.erasure_ledger
	WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NULL AND cancelled_at IS NULL`

// HeldBy counts the sessions the request uid holds in the ledger, neither
// erased nor cancelled: a finalizer asks the ledger, not the request's
// status, which a crash right after the tombstone's commit leaves without
// Tombstoned. Read only.
func (e *Eraser) HeldBy(ctx context.Context, uid string) (int64, error) {
	var n int64
	if err := e.Pool.QueryRow(ctx, heldBySQL, uid).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the request's ledger rows: %w", err)
	}
	return n, nil
}

// TombstoneStats is what the store's tombstones look like at one audit.
type TombstoneStats struct {
	// Sessions is how many of the store's sessions (of its tenant) are tombstoned.
	Sessions int64
	// Overdue is how long the most overdue tombstone has outlived its grace
	// period, or, held by no ledger row in force, its tombstone (0: none
	// is): a deletion that should have run, or a tombstone nothing ends.
	Overdue time.Duration
}

// tombstoneStatsSQL counts the tombstoned sessions of the tenant $1 and the
// seconds the most overdue of them is past due: its earliest grace end
// among the ledger rows in force (not erased, not cancelled), or, with no
// row in force (a tombstone nothing will lift or erase), its tombstone.
func tombstoneStatsSQL(l Layout) string {
	return `SELECT count(*), coalesce(extract(epoch FROM now() - min(coalesce(f.ends, s.tombstoned_at))
			FILTER (WHERE coalesce(f.ends, s.tombstoned_at) < now())), 0)::float8
		FROM ` + l.Sessions.Ident() + ` s
		LEFT JOIN LATERAL (SELECT min(g.grace_ends_at) AS ends FROM lethe.erasure_ledger g
			WHERE g.scope = 'session' AND g.record_id = s.id::text AND g.erased_at IS NULL AND g.cancelled_at IS NULL) f ON true
		WHERE s.tombstoned_at IS NOT NULL AND ($1::text IS NULL OR s.tenant_id = $1)`
}

// Tombstones reads the store's TombstoneStats; read only.
func (e *Eraser) Tombstones(ctx context.Context) (TombstoneStats, error) {
	var st TombstoneStats
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		var secs float64
		if err := tx.QueryRow(ctx, tombstoneStatsSQL(l), e.tenant()).Scan(&st.Sessions, &secs); err != nil {
			return fmt.Errorf("count tombstones: %w", err)
		}
		st.Overdue = time.Duration(secs * float64(time.Second))
		return nil
	})
	return st, err
}
