package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// Verify reports each leftover under its own check: rows written back
// (bypassing the re-ingestion guard, as a restore of a table would), a
// cache entry of erased content, a lineage row naming the session, and a
// requested session the ledger does not hold erased. Every count is read
// in one statement; a count reported under the wrong check, or not at
// all, fails here.
func TestVerifyCountsWhatIsLeftUnderEachCheck(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-verify-left", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	clean, err := e.Verify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clean {
		if c.Found != 0 {
			t.Fatalf("after the deletion: %s = %d", c.Check, c.Found)
		}
	}

	// Written back with the triggers off (superuser, replica role).
	mustExec(t, conn, `SET session_replication_role = replica`)
	mustExec(t, conn, `INSERT INTO memory.sessions (id, tenant_id, summary) VALUES ($1, 't1', 'back')`, sessA)
	mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text) SELECT $1, i, 'back' FROM generate_series(1, 2) i`, sessA)
	mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding) SELECT 'sha-a-fact', 't', array_fill(0.5, ARRAY[384])::vector`)
	mustExec(t, conn, `WITH p AS (INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ('t1', 'user', 'back') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, $1 FROM p`, sessA)
	mustExec(t, conn, `SET session_replication_role = origin`)

	// sessB was never requested: the ledger does not hold it erased.
	checks, err := e.Verify(ctx, erasure.Request{UID: req.UID, SessionIDs: []string{sessA, sessB}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, c := range checks {
		got[c.Check] = c.Found
	}
	want := map[string]int64{
		"rows of the sessions in memory.sessions":                     2, // A back, B live
		"rows of the sessions in memory.rounds":                       5, // A's 2 back, B's 3
		erasure.CheckPrefixContent + "memory_derived.embedding_cache": 1,
		erasure.CheckPrefixDerived + "memory_derived.derivations":     2, // A's one back, B's own (the one of A and B went with A)
		"requested sessions the ledger does not record as erased":     1,
	}
	for check, n := range want {
		if got[check] != n {
			t.Errorf("%s = %d, want %d (all: %v)", check, got[check], n, got)
		}
	}
	if len(checks) != len(clean) {
		t.Errorf("%d checks, want the %d of the request's own verification", len(checks), len(clean))
	}
}

// A store whose content-index registry is empty (the audit reports it)
// still verifies: the request's parameter stands in the statement without
// a content check to name it.
func TestVerifyWithoutAContentIndex(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	req := erasure.Request{UID: "uid-verify-no-index", SessionIDs: []string{sessA}}
	e := eraser(t, dsn, "t1")
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `DELETE FROM lethe.content_indexes`)
	checks, err := eraser(t, dsn, "t1").Verify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if strings.HasPrefix(c.Check, erasure.CheckPrefixContent) {
			t.Errorf("a content check with no content index registered: %s", c.Check)
		}
		if c.Found != 0 {
			t.Errorf("%s = %d", c.Check, c.Found)
		}
	}
}
