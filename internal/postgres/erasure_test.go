package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/testenv"
)

const (
	sessA = "00000000-0000-4000-8000-00000000000a" // tenant t1, erased
	sessB = "00000000-0000-4000-8000-00000000000b" // tenant t1, kept; shares an entity with A
	sessC = "00000000-0000-4000-8000-00000000000c" // tenant t2: another tenant's session
)

// seedTenants writes three sessions with rows in every table, an embedding on
// each, content hashes with cache entries, and a profile derived from each.
func seedTenants(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	for i, s := range []struct{ id, tenant string }{{sessA, "t1"}, {sessB, "t1"}, {sessC, "t2"}} {
		vec := fmt.Sprintf("(SELECT array_agg(sin(k * %d.37))::vector FROM generate_series(1, 384) k)", i+1)
		sha := "sha-" + s.id[len(s.id)-1:]
		mustExec(t, conn, `INSERT INTO memory.sessions (id, tenant_id, summary, summary_sha256, summary_embedding)
			VALUES ($1, $2, 'summary', $3, `+vec+`)`, s.id, s.tenant, sha+"-summary")
		for r := 0; r < 3; r++ {
			mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text, content_sha256, embedding)
				VALUES ($1, $2, 'text', $3, `+vec+` )`, s.id, r, fmt.Sprintf("%s-round-%d", sha, r))
		}
		mustExec(t, conn, `INSERT INTO memory.facts (session_id, round_id, kind, content, content_sha256, embedding)
			SELECT $1, id, 'learning', 'fact', $2, `+vec+` FROM memory.rounds WHERE session_id = $1`, s.id, sha+"-fact")
		mustExec(t, conn, `INSERT INTO memory.fact_corrections (fact_id, session_id, correction)
			SELECT id, $1, 'fix' FROM memory.facts WHERE session_id = $1`, s.id)
		mustExec(t, conn, `INSERT INTO memory.artifacts (session_id, kind, artifact_ref) VALUES ($1, 'commit', 'abc')`, s.id)
		mustExec(t, conn, `INSERT INTO memory.file_snapshots (session_id, path, content, content_sha256) VALUES ($1, 'a.go', 'x', $2)`, s.id, sha+"-file")
		mustExec(t, conn, `INSERT INTO memory.backfill_progress (source_path, session_id) VALUES ($1, $2)`, "f-"+s.id, s.id)
		for _, h := range []string{sha + "-summary", sha + "-round-0", sha + "-fact"} {
			mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding) VALUES ($1, 't', `+vec+`)`, h)
		}
		mustExec(t, conn, `WITH p AS (INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ($2, 'user', 'p') RETURNING id)
			INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, $1 FROM p`, s.id, s.tenant)
	}
	// A profile derived from A and B together goes with A.
	mustExec(t, conn, `WITH p AS (INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ('t1', 'project', 'ab') RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, s FROM p, unnest($1::uuid[]) s`,
		[]string{sessA, sessB})
}

func eraser(t *testing.T, dsn, tenant string) *postgres.Eraser {
	t.Helper()
	pool, err := postgres.Connect(context.Background(), dsn, postgres.Options{Vector: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: tenant}
}

// snapshot returns a digest of every row of every table Lethe may touch.
func snapshot(t *testing.T, conn *pgx.Conn) map[string]string {
	t.Helper()
	out, err := testenv.TableDigests(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func count(t testing.TB, conn *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Both ways a batch can take (batchguard.go) remove the same.
func TestEraseRemovesEveryLayerOfTheSessionAndNothingElse(t *testing.T) {
	t.Run("long way", func(t *testing.T) { eraseEveryLayer(t, false) })
	t.Run("short way", func(t *testing.T) { eraseEveryLayer(t, true) })
}

func eraseEveryLayer(t *testing.T, short bool) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	// A copy of one of A's embeddings in an unrelated table: residue the cascade misses.
	mustExec(t, conn, `CREATE TABLE public.exported_vectors (id int, v vector(384))`)
	mustExec(t, conn, `INSERT INTO public.exported_vectors SELECT 1, embedding FROM memory.rounds WHERE session_id = $1 LIMIT 1`, sessA)
	e := eraser(t, dsn, "t1")
	if short {
		e = primedPasses(t, dsn, conn)()
	}
	before := snapshot(t, conn)
	req := erasure.Request{UID: "uid-1", SessionIDs: []string{sessA, sessC}}

	plan, err := e.Tombstone(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plan.Found, []string{sessA}) || !slices.Equal(plan.NotFound, []string{sessC}) {
		t.Fatalf("found %v, not found %v: the other tenant's session must be 'not found'", plan.Found, plan.NotFound)
	}
	wantRows := map[string]int64{"memory.sessions": 1, "memory.rounds": 3, "memory.facts": 3, "memory.fact_corrections": 3,
		"memory.artifacts": 1, "memory.file_snapshots": 1, "memory.backfill_progress": 1}
	for _, c := range plan.Rows {
		if wantRows[c.Table] != c.Rows {
			t.Errorf("plan: %s = %d, want %d", c.Table, c.Rows, wantRows[c.Table])
		}
	}
	if plan.Embeddings != 7 || plan.ContentIndexEntries != 3 || plan.DerivedRecords != 2 {
		t.Errorf("plan: embeddings %d (want 7), cache entries %d (want 3), derived %d (want 2)", plan.Embeddings, plan.ContentIndexEntries, plan.DerivedRecords)
	}
	// Repeating the tombstone gives the same plan and writes nothing twice.
	again, err := e.Tombstone(ctx, req)
	if err != nil || !again.TombstonedAt.Equal(plan.TombstonedAt) || !slices.Equal(again.Found, plan.Found) {
		t.Fatalf("repeat tombstone differs: %v %+v", err, again)
	}
	// The latest tombstone of the sessions: the first run's, unchanged by a
	// repeat (the replica wait keeps its position); a session hidden again
	// moves it.
	if plan.HiddenAt.IsZero() || !again.HiddenAt.Equal(plan.HiddenAt) {
		t.Fatalf("hidden at %v, then %v on the repeat: want the first tombstone's, twice", plan.HiddenAt, again.HiddenAt)
	}
	mustExec(t, conn, `UPDATE memory.sessions SET tombstoned_at = NULL, tombstoned_by = NULL WHERE id = $1`, sessA)
	if third, err := e.Tombstone(ctx, req); err != nil || !third.HiddenAt.After(plan.HiddenAt) {
		t.Fatalf("hidden again: %v (%v), want after %v", third.HiddenAt, err, plan.HiddenAt)
	}

	// A batch holding a session the request did not find (C) takes the
	// long way: the short way erases only batches wholly eligible.
	del := req
	if short {
		del.SessionIDs = plan.Found
	}
	res, err := e.Delete(ctx, del, 100, 50)
	if err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); short && w.Short != 1 || !short && w.Long != 1 {
		t.Fatalf("batches by way: %+v, want this one the %s", w, map[bool]string{true: "short way", false: "long way"}[short])
	}
	if len(res.Batches) != 1 || res.Batches[0].Sessions != 1 || res.Batches[0].ContentIndexEntries != 3 || res.Batches[0].DerivedRecords != 2 {
		t.Fatalf("delete result: %+v", res.Batches)
	}
	if len(res.Probe) != 7 || res.CommitLSN == "" {
		t.Fatalf("probed %d embeddings (want all 7), lsn %q", len(res.Probe), res.CommitLSN)
	}
	for _, c := range res.Batches[0].Rows {
		if wantRows[c.Table] != c.Rows {
			t.Errorf("deleted: %s = %d, want %d", c.Table, c.Rows, wantRows[c.Table])
		}
	}
	// Verified is what the request found (the caller drops what was not found).
	checks, err := verifyBothWays(ctx, e, erasure.Request{UID: req.UID, SessionIDs: plan.Found}, res.ContentKeys)
	if err != nil {
		t.Fatal(err)
	}
	if len(checks) != 10 {
		t.Errorf("want 10 checks (7 tables, 1 content index, 1 lineage, the ledger), got %d: %+v", len(checks), checks)
	}
	for _, c := range checks {
		if c.Found != 0 {
			t.Errorf("left behind: %s = %d", c.Check, c.Found)
		}
	}
	residue, err := e.ProbeResidue(ctx, res.Probe, 1e-6)
	if err != nil {
		t.Fatal(err)
	}
	// A's seven embeddings are one vector (seedTenants): each has the copy.
	if len(residue) != 1 || residue[0].Column != "public.exported_vectors.v" || residue[0].Found != 7 {
		t.Fatalf("residue = %+v, want the copy in public.exported_vectors.v, found by each of the 7 sampled embeddings", residue)
	}

	// Nothing of B or C changed: compare each table's rows of the other sessions.
	for _, other := range []string{sessB, sessC} {
		for table, n := range map[string]int64{"memory.sessions": 1, "memory.rounds": 3, "memory.facts": 3, "memory.artifacts": 1} {
			key := "session_id"
			if table == "memory.sessions" {
				key = "id"
			}
			if got := count(t, conn, `SELECT count(*) FROM `+table+` WHERE `+key+` = $1`, other); got != n {
				t.Errorf("%s of %s: %d rows, want %d", table, other, got, n)
			}
		}
	}
	if got := count(t, conn, `SELECT count(*) FROM memory_derived.embedding_cache`); got != 6 {
		t.Errorf("cache entries left: %d, want 6 (B's and C's)", got)
	}
	if got := count(t, conn, `SELECT count(*) FROM memory_derived.profiles`); got != 2 {
		t.Errorf("profiles left: %d, want 2 (B's and C's own)", got)
	}
	after := snapshot(t, conn)
	if before["memory.sessions"] == after["memory.sessions"] {
		t.Error("snapshot did not change: the test cannot see changes")
	}

	// A repeat deletes nothing and writes no second receipt.
	res2, err := e.Delete(ctx, req, 100, 50)
	if err != nil || !res2.Batches[0].Skipped {
		t.Fatalf("repeat delete: %v %+v", err, res2.Batches)
	}
	if got := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = 'uid-1'`); got != 2 {
		t.Errorf("receipts: %d, want exactly 2 (Tombstoned, Deleted batch 0)", got)
	}
	if _, err := e.Cancel(ctx, req.UID); !errors.Is(err, erasure.ErrTooLateToCancel) {
		t.Errorf("cancel after deletion: %v, want ErrTooLateToCancel", err)
	}
}

func TestDeleteWaitsForTheGracePeriodByTheDatabaseClock(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "")
	req := erasure.Request{UID: "uid-g", SessionIDs: []string{sessA}, Grace: time.Hour}
	plan, err := e.Tombstone(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.Grace(ctx, req.UID)
	if err != nil || g.Elapsed || g.GraceEndsAt.Sub(g.Now) < 59*time.Minute || g.LedgerRows != 1 || g.NotErased != 1 ||
		!g.TombstonedAt.Equal(plan.TombstonedAt) {
		t.Fatalf("grace: %+v %v: want not elapsed, an hour left, 1 ledger row not erased, tombstoned at %v", g, err, plan.TombstonedAt)
	}
	if none, err := e.Grace(ctx, "uid-never-tombstoned"); err != nil || none.LedgerRows != 0 || none.NotErased != 0 || !none.TombstonedAt.IsZero() {
		t.Fatalf("grace of a request with no ledger row: %+v %v: want 0 rows", none, err)
	}
	res, err := e.Delete(ctx, req, 100, 10)
	if err != nil || !res.Batches[0].Skipped {
		t.Fatalf("delete inside the grace period: %v %+v", err, res.Batches)
	}
	if got := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); got != 1 {
		t.Fatal("session deleted inside its grace period")
	}
	// Move the grace end into the past, as the database clock passing it would.
	mustExec(t, conn, `UPDATE lethe.erasure_ledger SET grace_ends_at = now() - interval '1 second' WHERE request_uid = 'uid-g'`)
	res, err = e.Delete(ctx, req, 100, 10)
	if err != nil || res.Batches[0].Sessions != 1 {
		t.Fatalf("delete after the grace period: %v %+v", err, res.Batches)
	}
	if g, err = e.Grace(ctx, req.UID); err != nil || g.LedgerRows != 1 || g.NotErased != 0 {
		t.Fatalf("grace after the deletion: %+v %v: want 1 ledger row, erased", g, err)
	}
}

func TestCancelLiftsTheTombstoneAndStopsDeletion(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	e := eraser(t, dsn, "")
	req := erasure.Request{UID: "uid-c", SessionIDs: []string{sessA, sessB}}
	other := erasure.Request{UID: "uid-other", SessionIDs: []string{sessB}, Grace: time.Hour}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Tombstone(ctx, other); err != nil {
		t.Fatal(err)
	}
	first, err := e.Cancel(ctx, req.UID)
	if err != nil {
		t.Fatal(err)
	}
	if first.Lifted != 1 {
		t.Errorf("lifted %d tombstones, want 1 (B stays tombstoned by the other request)", first.Lifted)
	}
	// A cancelled row is not erased: a deletion that finds the sessions must
	// not take the ledger for lost and erase them again.
	if g, err := e.Grace(ctx, req.UID); err != nil || g.LedgerRows != 2 || g.NotErased != 2 {
		t.Errorf("grace after the cancel: %+v %v: want 2 ledger rows, both not erased", g, err)
	}
	if got := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NULL AND id = $1`, sessA); got != 1 {
		t.Error("A is still tombstoned after cancel")
	}
	var holder string
	if err := conn.QueryRow(ctx, `SELECT tombstoned_by FROM memory.sessions WHERE id = $1`, sessB).Scan(&holder); err != nil || holder != "uid-other" {
		t.Errorf("B's tombstone holder = %q (%v), want uid-other", holder, err)
	}
	again, err := e.Cancel(ctx, req.UID)
	if err != nil || again.Lifted != first.Lifted {
		t.Errorf("repeat cancel reported %d (%v), want the first run's %d", again.Lifted, err, first.Lifted)
	}
	res, err := e.Delete(ctx, req, 100, 10)
	if err != nil || !res.Batches[0].Skipped {
		t.Fatalf("delete after cancel: %v %+v", err, res.Batches)
	}
	if got := count(t, conn, `SELECT count(*) FROM memory.sessions`); got != 3 {
		t.Errorf("sessions left %d, want 3", got)
	}
}

func TestPlanOnlyChangesNothing(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	before := snapshot(t, conn)
	e := eraser(t, dsn, "t1")
	plan, err := e.Plan(ctx, erasure.Request{UID: "uid-d", SessionIDs: []string{sessA, sessB}})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Found) != 2 || plan.Embeddings != 14 || plan.DerivedRecords != 3 {
		t.Fatalf("plan: %+v", plan)
	}
	after := snapshot(t, conn)
	for table, d := range before {
		if after[table] != d {
			t.Errorf("dry run changed %s", table)
		}
	}
	if len(before) < 10 {
		t.Fatalf("snapshot covers only %d tables", len(before))
	}
}

// Every step works on a pool of a single connection: no step may ask the
// pool for a second connection while its transaction holds the first
// (with as many concurrent passes as connections, that deadlocked the
// manager with its default flags: 4 reconciles, 4 connections).
func TestEveryStepWorksOnAPoolOfOneConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := migratedDB(t)
	seedTenants(t, connect(t, dsn))
	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	req := erasure.Request{UID: "uid-one-conn", SessionIDs: []string{sessA}}
	// A fresh Eraser per call, as the controller makes one per pass: each
	// loads the layout again.
	fresh := func() *postgres.Eraser { return &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"} }
	if _, err := fresh().Plan(ctx, req); err != nil {
		t.Fatalf("plan: %v", err)
	}
	if _, err := fresh().Tombstone(ctx, req); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	res, err := fresh().Delete(ctx, req, 10, 4)
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
	if len(res.Batches) != 1 || res.Batches[0].Sessions != 1 {
		t.Fatalf("delete result: %+v", res.Batches)
	}
	if left, err := verifyBothWays(ctx, fresh(), req, res.ContentKeys); err != nil {
		t.Fatalf("verify: %v", err)
	} else {
		for _, v := range left {
			if v.Found != 0 {
				t.Errorf("verify: %+v", v)
			}
		}
	}
}
