package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// A tombstone within its grace period is not overdue; one that no ledger
// row in force holds (nothing will lift or erase it) is, from its tombstone.
func TestTombstoneStatsCountOrphansAsOverdue(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	if _, err := e.Tombstone(ctx, erasure.Request{UID: "uid-grace", SessionIDs: []string{sessA}, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	st, err := e.Tombstones(ctx)
	if err != nil || st.Sessions != 1 || st.Overdue != 0 {
		t.Fatalf("one tombstone in its grace: %+v, %v; want 1 session, not overdue", st, err)
	}
	mustExec(t, conn, `UPDATE memory.sessions SET tombstoned_at = now() - interval '2 hours', tombstoned_by = 'uid-cancelled' WHERE id = $1`, sessB)
	st, err = e.Tombstones(ctx)
	if err != nil || st.Sessions != 2 || st.Overdue < 2*time.Hour-time.Minute || st.Overdue > 2*time.Hour+time.Minute {
		t.Fatalf("an orphan tombstone of two hours: %+v, %v; want 2 sessions, about 2h overdue", st, err)
	}
}
