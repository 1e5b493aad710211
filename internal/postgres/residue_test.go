package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// Residue written after the deletion by paths that bypass the guards — an
// owner's job with triggers off (session_replication_role = replica, as
// logical replication and many restore tools run), a cache refilled with an
// erased hash — is removed by re-verification, with a receipt, and only
// that: the other sessions' derived records and cache entries stay.
func TestResidueAfterTheDeletionIsRemovedWithAReceipt(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-residue", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if res, err := e.Reerase(ctx, req); err != nil || !res.Skipped {
		t.Fatalf("nothing came back yet: %+v, %v", res, err)
	}
	profilesBefore := count(t, conn, `SELECT count(*) FROM memory_derived.profiles`)
	cacheBefore := count(t, conn, `SELECT count(*) FROM memory_derived.embedding_cache`)

	plantResidue(t, conn)
	res, err := e.Reerase(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped || res.DerivedRecords != 1 || res.ContentIndexEntries != 1 || res.Sessions != 0 {
		t.Fatalf("re-verification removed %+v, want 1 derived record and 1 cache entry, no session", res)
	}
	assertResidueGone(t, conn, profilesBefore, cacheBefore)
	receipts, err := e.Receipts(ctx, req.UID, erasure.StepResurrected)
	if err != nil || len(receipts) != 1 {
		t.Fatalf("Resurrected receipts %v (%v), want one", receipts, err)
	}
	for _, r := range receipts {
		if r.Counts[erasure.CountDerivedRecords] != 1 || r.Counts[erasure.CountContentIndexEntries] != 1 {
			t.Errorf("receipt counts %v, want the removed derived record and cache entry", r.Counts)
		}
	}

	// RemoveResidue (the Deleted step's own check) does the same.
	plantResidue(t, conn)
	var before string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	removed, err := e.RemoveResidue(ctx, erasure.Request{UID: req.UID, SessionIDs: []string{sessA, sessB}})
	if err != nil {
		t.Fatal(err)
	}
	if removed.Skipped || removed.DerivedRecords != 1 || removed.ContentIndexEntries != 1 {
		t.Fatalf("RemoveResidue removed %+v, want 1 derived record and 1 cache entry (sessB is live: not its to remove)", removed)
	}
	// The position for the replica wait is past the removal's commit.
	var past bool
	if err := conn.QueryRow(ctx, `SELECT $1::pg_lsn > $2::pg_lsn`, removed.CommitLSN, before).Scan(&past); err != nil || !past {
		t.Errorf("RemoveResidue's position %q is not past %s, read before it (%v)", removed.CommitLSN, before, err)
	}
	assertResidueGone(t, conn, profilesBefore, cacheBefore)
	if r, err := e.Receipts(ctx, req.UID, erasure.StepResidueRemoved); err != nil || len(r) != 1 {
		t.Fatalf("ResidueRemoved receipts %v (%v), want one", r, err)
	}
	if again, err := e.RemoveResidue(ctx, req); err != nil || !again.Skipped {
		t.Fatalf("nothing left: %+v, %v", again, err)
	}
}

// plantResidue writes, as the owner with triggers off, a profile whose
// lineage names the erased session A, and re-caches one of A's hashes.
func plantResidue(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	mustExec(t, conn, `BEGIN`)
	mustExec(t, conn, `SET LOCAL session_replication_role = replica`)
	mustExec(t, conn, `WITH p AS (INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ('t1', 'user', 'planted') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, $1 FROM p`, sessA)
	mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding)
		SELECT 'sha-a-round-0', 't', embedding FROM memory_derived.embedding_cache LIMIT 1`)
	mustExec(t, conn, `COMMIT`)
}

// assertResidueGone checks that the planted rows are gone and nothing else.
func assertResidueGone(t *testing.T, conn *pgx.Conn, profilesBefore, cacheBefore int64) {
	t.Helper()
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.profiles WHERE summary = 'planted'`); n != 0 {
		t.Errorf("the planted profile of the erased session survived: %d", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.embedding_cache WHERE content_sha256 = 'sha-a-round-0'`); n != 0 {
		t.Errorf("the re-cached erased content survived: %d", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.profiles`); n != profilesBefore {
		t.Errorf("profiles %d, want %d: only the residue goes", n, profilesBefore)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.embedding_cache`); n != cacheBefore {
		t.Errorf("cache entries %d, want %d: only the residue goes", n, cacheBefore)
	}
}
