package postgres_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// verifyBothWays verifies req with the content keys of its deletion, then
// with none (every content-index entry hashed), and returns the first
// result, or an error when the two differ: the keys may change how Verify
// looks, never what it finds. (A deletion in a content index smaller than
// its keys sends none: then both ways hash it whole.)
func verifyBothWays(ctx context.Context, e *postgres.Eraser, req erasure.Request, keys erasure.ContentKeys) ([]erasure.Verification, error) {
	keyed, err := e.Verify(ctx, req, keys)
	if err != nil {
		return nil, err
	}
	scanned, err := e.Verify(ctx, req, nil)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(keyed, scanned) {
		return nil, fmt.Errorf("verified with the deletion's %d content keys: %v; hashing every content-index entry: %v", len(keys), keyed, scanned)
	}
	return keyed, nil
}

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
	padCache(t, conn, 200)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-verify-left", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	clean, err := verifyBothWays(ctx, e, req, res.ContentKeys)
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
	checks, err := verifyBothWays(ctx, e, erasure.Request{UID: req.UID, SessionIDs: []string{sessA, sessB}}, res.ContentKeys)
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
	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `DELETE FROM lethe.content_indexes`)
	checks, err := verifyBothWays(ctx, eraser(t, dsn, "t1"), req, res.ContentKeys)
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

// padCache adds n cache entries of another tenant's content: with more
// entries than a deletion's keys, Verify looks the cache up by the keys
// when they cover the ledger (a smaller cache is hashed whole).
func padCache(t *testing.T, conn *pgx.Conn, n int) {
	t.Helper()
	mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids)
		SELECT 'other-' || i, 't', array_fill(0.1, ARRAY[384])::vector, ARRAY['t2'] FROM generate_series(1, $1::int) i`, n)
}

// A session's content that left it between its tombstone and its deletion
// (a round deleted by its owner, here bypassing the guards) keeps its
// content ledger row, and the deletion, which reads the sessions' content
// when it runs, leaves its cache entry. Verify must still count that entry:
// the deletion's keys do not cover the ledger, so it hashes the cache
// rather than looking up only by the keys, which would miss it.
func TestVerifyFindsContentThatLeftTheSessionsAfterTheirTombstone(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	padCache(t, conn, 200)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-verify-moved", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	const moved = "sha-a-round-0" // seedTenants: A's first round, cached
	mustExec(t, conn, `SET session_replication_role = replica`)
	mustExec(t, conn, `DELETE FROM memory.rounds WHERE session_id = $1 AND content_sha256 = $2`, sessA, moved)
	mustExec(t, conn, `SET session_replication_role = origin`)
	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ContentKeys) == 0 || slices.Contains(res.ContentKeys, moved) {
		t.Fatalf("the deletion's content keys %v: want A's content without %s", res.ContentKeys, moved)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.embedding_cache WHERE content_sha256 = $1`, moved); n != 1 {
		t.Fatalf("the moved content's cache entry: %d rows, want the one the deletion could not see", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.embedding_cache WHERE content_sha256 = ANY($1::text[])`, []string(res.ContentKeys)); n != 0 {
		t.Fatalf("%d cache entries under the deletion's own keys: the test needs a leftover only the ledger names", n)
	}
	checks, err := verifyBothWays(ctx, e, req, res.ContentKeys)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]int64{}
	for _, c := range checks {
		found[c.Check] = c.Found
	}
	if n := found[erasure.CheckPrefixContent+"memory_derived.embedding_cache"]; n != 1 {
		t.Errorf("content entries left: %d, want 1 (all: %v)", n, found)
	}
}

// With the deletion's keys covering the request's content ledger rows, the
// content check looks the cache up by index and never runs the branch that
// hashes every entry; without keys, it runs that branch, with one call of
// the bulk hash. Checked on a cache of 5,000 other entries, analyzed, and
// then of 2, fewer than the keys: then hashing the cache is cheaper.
func TestVerifyLooksTheContentIndexUpByTheDeletionsKeys(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	padCache(t, conn, 5000)
	mustExec(t, conn, `ANALYZE memory_derived.embedding_cache`)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-verify-plan", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ContentKeys) == 0 {
		t.Fatal("the deletion kept no content keys")
	}
	explain := func(keys erasure.ContentKeys) string {
		t.Helper()
		rows, err := conn.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT (`+postgres.ContentCheckSQL("memory_derived", "embedding_cache", "content_sha256", "tenant_ids", true)+`), $1::text[]`,
			[]string{sessA}, req.UID, []string(keys))
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	// A cache scan that ran shows its rows; one never run says so.
	scanRan := regexp.MustCompile(`Seq Scan on embedding_cache i(_\d+)? \(actual rows=[1-9]`)
	bulkHashed := regexp.MustCompile(`Function Scan on content_hashes h(_\d+)? \(actual rows=[1-9]\d* loops=1\)`)
	keyed := explain(res.ContentKeys)
	if scanRan.MatchString(keyed) || !strings.Contains(keyed, "Index Scan using embedding_cache_pkey on embedding_cache i") {
		t.Errorf("with the deletion's keys, the check reads the whole cache or not by its key:\n%s", keyed)
	}
	if !bulkHashed.MatchString(keyed) || !strings.Contains(keyed, "hashed SubPlan") {
		t.Errorf("with the deletion's keys, the coverage check does not hash them in one call into a hash table:\n%s", keyed)
	}
	scanned := explain(nil)
	if !scanRan.MatchString(scanned) || !bulkHashed.MatchString(scanned) {
		t.Errorf("without keys, the check does not hash the whole cache in one call:\n%s", scanned)
	}
	// A cache with fewer entries than keys is hashed whole: fewer hashes.
	mustExec(t, conn, `DELETE FROM memory_derived.embedding_cache WHERE content_sha256 NOT IN ('other-1', 'other-2')`)
	small := explain(res.ContentKeys)
	if !scanRan.MatchString(small) || !bulkHashed.MatchString(small) || !regexp.MustCompile(`Index Scan using embedding_cache_pkey on embedding_cache i \(never executed\)`).MatchString(small) {
		t.Errorf("with %d keys and 2 cache entries, the check does not hash the cache instead of the keys:\n%s", len(res.ContentKeys), small)
	}
}

// The kept keys stop at erasure.MaxContentKeys: past it none are kept, for
// the rest of the deletion too.
func TestContentKeysKeptWithinTheirBound(t *testing.T) {
	many := make([]string, erasure.MaxContentKeys)
	kept := postgres.KeepContentKeys(erasure.ContentKeys{}, many[:erasure.MaxContentKeys-1], false)
	if kept = postgres.KeepContentKeys(kept, many[:1], false); len(kept) != erasure.MaxContentKeys {
		t.Fatalf("kept %d keys, want all %d", len(kept), erasure.MaxContentKeys)
	}
	if kept = postgres.KeepContentKeys(kept, many[:1], false); kept != nil {
		t.Fatalf("one key past the bound: kept %d, want none", len(kept))
	}
	if kept = postgres.KeepContentKeys(kept, nil, false); kept != nil {
		t.Fatalf("after the bound was passed: kept %d, want none", len(kept))
	}
	if kept = postgres.KeepContentKeys(erasure.ContentKeys{}, nil, false); kept == nil {
		t.Fatal("a batch without content: the keys became unknown")
	}
	if kept = postgres.KeepContentKeys(erasure.ContentKeys{"k"}, nil, true); kept != nil {
		t.Fatalf("a batch with too many keys to read: kept %d, want none", len(kept))
	}
}

// A content index whose key compares case-insensitively (a
// nondeterministic collation) holds the erased content's key and, first, a
// key equal to it under that collation but not byte for byte: another
// content, another hash. Both ways count the erased one: hashing every key
// must not take the two for one.
func TestVerifyHashesEveryKeyOfACaseInsensitiveContentIndex(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	mustExec(t, conn, `CREATE COLLATION memory_derived.nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`)
	mustExec(t, conn, `CREATE TABLE memory_derived.nocase_cache (content_sha256 text COLLATE memory_derived.nocase NOT NULL, tenant_id text NOT NULL)`)
	mustExec(t, conn, `INSERT INTO memory_derived.nocase_cache VALUES ('SHA-ERASED', 't1'), ('sha-erased', 't1'), ('sha-other', 't1')`)
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at)
		VALUES ('content', lethe.content_hash('sha-erased'), 'uid-nocase', 't1', now(), now())`)
	check := `SELECT (` + postgres.ContentCheckSQL("memory_derived", "nocase_cache", "content_sha256", "tenant_id", false) + `), $1::text[]`
	for _, keys := range []erasure.ContentKeys{nil, {"sha-erased"}, {"sha-erased", "x1", "x2", "x3"}} {
		var n int64
		if err := conn.QueryRow(ctx, check, []string{}, "uid-nocase", []string(keys)).Scan(&n, nil); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("with %d keys: %d entries of the erased content, want 1", len(keys), n)
		}
	}
}

// Hashing every key of a large content index goes in arrays of about
// 50,000 keys, not one array of the whole column (capped at 1 GB): three
// calls of the bulk hash for 120,001 keys (by the table's statistics), and
// the same count.
func TestVerifyHashesALargeContentIndexInChunks(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	mustExec(t, conn, `CREATE TABLE memory_derived.big_cache (content_sha256 text NOT NULL)`)
	mustExec(t, conn, `INSERT INTO memory_derived.big_cache SELECT 'sha-' || i FROM generate_series(1, 120000) i`)
	mustExec(t, conn, `INSERT INTO memory_derived.big_cache VALUES ('sha-erased')`)
	mustExec(t, conn, `ANALYZE memory_derived.big_cache`)
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at)
		VALUES ('content', lethe.content_hash('sha-erased'), 'uid-big', now(), now())`)
	check := `SELECT (` + postgres.ContentCheckSQL("memory_derived", "big_cache", "content_sha256", "", false) + `), $1::text[]`
	var n int64
	if err := conn.QueryRow(ctx, check, []string{}, "uid-big", nil).Scan(&n, nil); err != nil || n != 1 {
		t.Fatalf("entries of the erased content: %d (%v), want 1", n, err)
	}
	rows, err := conn.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) `+check, []string{}, "uid-big", nil)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if !regexp.MustCompile(`Function Scan on content_hashes h \(actual rows=\d+ loops=3\)`).MatchString(plan) {
		t.Errorf("120,001 keys are not hashed in three calls:\n%s", plan)
	}
}

// Sending the content keys costs as much as Verify's hashing of as many
// content-index entries: a deletion whose content index held fewer entries
// than its keys sends none (Verify hashes that table whole), and one whose
// index held as many sends them all.
func TestDeletionSendsContentKeysOnlyForALargerContentIndex(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	mustExec(t, conn, `DELETE FROM memory_derived.embedding_cache WHERE content_sha256 NOT LIKE 'sha-a-%'`)
	e := eraser(t, dsn, "t1")
	small := erasure.Request{UID: "uid-small-cache", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, small); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, small, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.ContentKeys != nil {
		t.Errorf("3 cache entries, 6 content hashes: the deletion sent %d keys, want none", len(res.ContentKeys))
	}
	padCache(t, conn, 6)
	large := erasure.Request{UID: "uid-large-cache", SessionIDs: []string{sessB}}
	if _, err := e.Tombstone(ctx, large); err != nil {
		t.Fatal(err)
	}
	if res, err = e.Delete(ctx, large, 10, 0); err != nil {
		t.Fatal(err)
	}
	if len(res.ContentKeys) != 6 {
		t.Errorf("9 cache entries, 6 content hashes: the deletion sent %d keys, want 6", len(res.ContentKeys))
	}
}
