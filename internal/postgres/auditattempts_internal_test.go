package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The long way audits again only while the catalog moves under it, and the
// last attempt settles; any other error ends the attempts at once.
func TestAuditAttemptsSettleOnTheLastAndStopOnOtherErrors(t *testing.T) {
	ctx := context.Background()
	var settles []bool
	err := auditAttempts(ctx, func(settle bool) error {
		settles = append(settles, settle)
		if settle {
			return nil
		}
		return errCatalogMoved
	})
	if err != nil || len(settles) != longWayAttempts || settles[0] || !settles[longWayAttempts-1] {
		t.Errorf("moving catalog: err %v, attempts settling %v, want %d attempts, only the last settling", err, settles, longWayAttempts)
	}

	settles = nil
	err = auditAttempts(ctx, func(settle bool) error {
		settles = append(settles, settle)
		return &pgconn.PgError{Code: sqlStateBatchGuard}
	})
	if !catalogMoved(err) || len(settles) != longWayAttempts {
		t.Errorf("epoch replaced at every end: err %v after %d attempts, want LE004 after %d", err, len(settles), longWayAttempts)
	}

	settles = nil
	other := errors.New("another failure")
	err = auditAttempts(ctx, func(settle bool) error {
		settles = append(settles, settle)
		return other
	})
	if !errors.Is(err, other) || len(settles) != 1 {
		t.Errorf("other error: %v after %d attempts, want it after 1", err, len(settles))
	}
}
