package postgres_test

import (
	"context"
	"testing"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// The WAL position a deletion returns (what the replicas must replay past
// before Deleted is True) is past every commit of the deletion, also that
// of a last batch that erased nothing itself but marked erased a session
// another request had erased first: that batch moves the ledger's
// erased_at, and a replica short of its commit may still serve the
// session's rows. The commit's end is read from the WAL (pg_walinspect).
func TestDeletePositionCoversALastBatchThatMarkedSessionsGone(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	mustExec(t, conn, `CREATE EXTENSION pg_walinspect`)
	e := eraser(t, dsn, "")
	both := erasure.Request{UID: "uid-both", SessionIDs: []string{sessA, sessB}}
	first := erasure.Request{UID: "uid-first", SessionIDs: []string{sessB}}
	for _, req := range []erasure.Request{both, first} {
		if _, err := e.Tombstone(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, conn, `UPDATE lethe.erasure_ledger SET grace_ends_at = now() - interval '1 second'`)
	// The other request erases B first.
	firstRes, err := e.Delete(ctx, first, 100, 0)
	if err != nil || firstRes.Batches[0].Sessions != 1 {
		t.Fatalf("the other request's deletion: %v %+v", err, firstRes.Batches)
	}
	erasedWithPosition(t, e, first.UID, firstRes) // read with the batch's own commit-time update
	var start string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	// Batches of one, in order: A is erased by batch 0; batch 1 finds B
	// gone and marks it erased for this request too.
	res, err := e.Delete(ctx, both, 1, 0)
	if err != nil || len(res.Batches) != 2 || res.Batches[0].Sessions != 1 || !res.Batches[1].Skipped {
		t.Fatalf("deletion: %v %+v: want batch 0 erasing A, batch 1 skipped", err, res.Batches)
	}
	var markedGone string
	if err := conn.QueryRow(ctx, `SELECT w.end_lsn::text FROM lethe.erasure_ledger l
		JOIN pg_get_wal_records_info($1::pg_lsn, pg_current_wal_lsn()) w
		  ON w.resource_manager = 'Transaction' AND w.record_type = 'COMMIT' AND w.xid::text = l.xmin::text
		WHERE l.request_uid = $2 AND l.scope = 'session' AND l.record_id = $3 AND l.erased_at IS NOT NULL`,
		start, both.UID, sessB).Scan(&markedGone); err != nil {
		t.Fatalf("the commit that marked B erased for %s: %v", both.UID, err)
	}
	var covered bool
	if err := conn.QueryRow(ctx, `SELECT $1::pg_lsn >= $2::pg_lsn`, res.CommitLSN, markedGone).Scan(&covered); err != nil {
		t.Fatal(err)
	}
	if !covered {
		t.Errorf("the deletion's position %s is before the commit %s that marked B erased for its request", res.CommitLSN, markedGone)
	}
	erasedWithPosition(t, e, both.UID, res) // read again after the batch that marked B
}

// erasedWithPosition checks the deletion time a deletion read with its
// position: with no other writer, the ledger's latest erased_at now.
func erasedWithPosition(t *testing.T, e *postgres.Eraser, uid string, res erasure.DeleteResult) {
	t.Helper()
	want, err := e.DeletedAt(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}
	if want.IsZero() || !res.ErasedAt.Equal(want) {
		t.Errorf("%s: the erasure time read with the position is %v, want the ledger's latest %v", uid, res.ErasedAt, want)
	}
}
