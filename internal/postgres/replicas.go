package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// replayedPastSQL tells whether the server replayed the WAL past $1; NULL
// on a server that is not a replica.
const replayedPastSQL = `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`

// ErrNotReplica is returned for a "replica" that is a primary (a
// configuration mistake: the Secret names the wrong server).
var ErrNotReplica = errors.New("the server is not a replica (pg_last_wal_replay_lsn() is null)")

// ReplicaCaughtUp reports whether the replica behind q has replayed past lsn.
func ReplicaCaughtUp(ctx context.Context, q Querier, lsn string) (bool, error) {
	var ok *bool
	if err := q.QueryRow(ctx, replayedPastSQL, lsn).Scan(&ok); err != nil {
		return false, fmt.Errorf("read replay position: %w", err)
	}
	if ok == nil {
		return false, ErrNotReplica
	}
	return *ok, nil
}

// Replicas are a store's read replicas, one Querier (a pool) each.
type Replicas []Querier

var _ erasure.Replicas = Replicas(nil)

// CaughtUp reports whether every replica replayed past lsn: true when there
// is none; false at the first that has not; an error (naming the replica
// by its position) when one cannot say, or is not a replica.
func (rs Replicas) CaughtUp(ctx context.Context, lsn string) (bool, error) {
	for i, q := range rs {
		ok, err := ReplicaCaughtUp(ctx, q, lsn)
		if err != nil {
			return false, fmt.Errorf("replica %d: %w", i, err)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}
