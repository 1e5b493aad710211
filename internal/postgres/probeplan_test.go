package postgres_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// The residue probe sends the whole sample to a column in one statement;
// each vector of it must still be one nearest-neighbour lookup of the
// column's HNSW index, not a scan of the column per vector (a copy table
// can be as large as the store).
func TestResidueProbeLooksEachVectorUpByIndex(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	mustExec(t, conn, `CREATE TABLE public.copies (id int, v vector(3))`)
	mustExec(t, conn, `INSERT INTO public.copies SELECT i, ARRAY[-0.01 - random(), random(), random()]::vector FROM generate_series(1, 20000) i`)
	mustExec(t, conn, `INSERT INTO public.copies VALUES (0, '[1,2,3]'), (-1, '[3,1,2]')`)
	mustExec(t, conn, `CREATE INDEX copies_v ON public.copies USING hnsw (v vector_cosine_ops)`)
	mustExec(t, conn, `ANALYZE public.copies`)

	sql := postgres.NearCopiesSQL("public", "copies", "v")
	literal := strings.NewReplacer("$1", `'{"[1,2,3]","[2,4,6.5]","[-1,-1,-1]"}'::vector[]`, "$2", "1e-6").Replace(sql)
	plan := strings.Join(queryStrings(t, conn, `EXPLAIN `+literal), "\n")
	lookup := regexp.MustCompile(`Index Scan using copies_v on copies\s`)
	if strings.Contains(plan, "Seq Scan on copies") || !lookup.MatchString(plan) {
		t.Errorf("the probe does not look each vector up by the column's index:\n%s", plan)
	}

	// Counted: the first vector has a copy (distance 0); the second and the
	// third point the way of no stored vector (the random ones all have a
	// negative first component).
	var n int64
	if err := conn.QueryRow(ctx, sql, `{"[1,2,3]","[2,4,6.5]","[-1,-1,-1]"}`, 1e-6).Scan(&n); err != nil || n != 1 {
		t.Fatalf("vectors with a copy: %d, %v; want 1", n, err)
	}
	// [2,4,6] is [1,2,3] scaled: at cosine distance 0 it is a copy too.
	if err := conn.QueryRow(ctx, sql, `{"[1,2,3]","[2,4,6]","[3,1,2]"}`, 1e-6).Scan(&n); err != nil || n != 3 {
		t.Fatalf("vectors with a copy: %d, %v; want 3", n, err)
	}
}

// The probes' list of vector columns is shared by a store's passes under a
// catalog epoch: a copy table created after a probe is DDL, and the next
// probe finds the copy in it, even in the same pass (whose layout was read
// under the epoch before).
func TestResidueProbeSeesAVectorColumnCreatedSinceTheLastProbe(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	base := eraser(t, dsn, "t1")
	memo := &postgres.AuditMemo{}
	pass := func() *postgres.Eraser {
		return &postgres.Eraser{Pool: base.Pool, Schema: base.Schema, TenantID: base.TenantID, Memo: memo}
	}
	req := erasure.Request{UID: "uid-late-copy", SessionIDs: []string{sessA}}
	if _, err := pass().Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `CREATE TABLE public.early_copy (v vector(384))`)
	mustExec(t, conn, `INSERT INTO public.early_copy SELECT embedding FROM memory.rounds WHERE session_id = $1 LIMIT 1`, sessA)
	res, err := pass().Delete(ctx, req, 10, 4)
	if err != nil {
		t.Fatal(err)
	}
	first := pass()
	if residue, err := first.ProbeResidue(ctx, res.Probe, 1e-6); err != nil || len(residue) != 1 || residue[0].Column != "public.early_copy.v" {
		t.Fatalf("first pass: residue %+v, %v; want the copy in public.early_copy.v", residue, err)
	}
	mustExec(t, conn, `CREATE TABLE public.late_copy (v vector(384))`)
	mustExec(t, conn, `INSERT INTO public.late_copy SELECT v FROM public.early_copy`)
	residue, err := first.ProbeResidue(ctx, res.Probe, 1e-6)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range residue {
		got[r.Column] = true
	}
	if !got["public.late_copy.v"] || !got["public.early_copy.v"] {
		t.Errorf("second probe: residue %+v; want copies in public.early_copy.v and public.late_copy.v", residue)
	}
}

// Skipping the entries of a content index that an erasure still shares
// costs a ledger lookup (lethe.is_erased_content) per entry looked at. The
// probe asks it only of an entry as near as a copy: a probe that finds no
// copy asks nothing, whether the planner scans the table (a small one) or
// walks its index.
func TestResidueProbeAsksTheLedgerOnlyAboutNearEntries(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids)
		SELECT md5(i::text), 'cached', (SELECT array_agg(-0.01 - random())::vector FROM generate_series(1, 384) WHERE i > 0), ARRAY['t1']
		FROM generate_series(1, 300) i`)
	mustExec(t, conn, `ANALYZE memory_derived.embedding_cache`)
	var stored string
	if err := conn.QueryRow(ctx, `SELECT embedding::text FROM memory_derived.embedding_cache LIMIT 1`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	far := "[" + strings.TrimSuffix(strings.Repeat("1,", 384), ",") + "]" // every stored vector is all negative
	sql := postgres.ContentNearCopiesSQL("memory_derived", "embedding_cache", "content_sha256", "embedding", "tenant_ids")
	asked := func(vs ...string) (copies, calls int64) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SET LOCAL track_functions = 'all'`); err != nil {
			t.Fatal(err)
		}
		// The counts are this backend's not yet flushed: a difference.
		lookups := func() (n int64) {
			if err := tx.QueryRow(ctx, `SELECT coalesce(sum(pg_stat_get_xact_function_calls(p.oid)), 0)::bigint
				FROM pg_proc p WHERE p.oid::regproc::text = 'lethe.is_erased_content'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := lookups()
		if err := tx.QueryRow(ctx, sql, vs, 1e-6).Scan(&copies); err != nil {
			t.Fatal(err)
		}
		return copies, lookups() - before
	}
	for _, plan := range []string{"scan", "index"} {
		want := "Seq Scan on embedding_cache"
		if plan == "scan" {
			mustExec(t, conn, `SET enable_indexscan = off`)
		} else {
			mustExec(t, conn, `RESET enable_indexscan`)
			mustExec(t, conn, `SET enable_seqscan = off`)
			want = "Index Scan using embedding_cache_embedding_hnsw on embedding_cache"
		}
		literal := strings.NewReplacer("$1", `ARRAY['`+far+`']`, "$2", "1e-6").Replace(sql)
		if got := strings.Join(queryStrings(t, conn, `EXPLAIN `+literal), "\n"); !strings.Contains(got, want) {
			t.Fatalf("%s: the plan is not the one this case is about (%s):\n%s", plan, want, got)
		}
		if copies, calls := asked(far, far, far); copies != 0 || calls != 0 {
			t.Errorf("%s: three vectors near no entry: %d copies, %d ledger lookups; want 0 and 0", plan, copies, calls)
		}
		if copies, calls := asked(stored, far); copies != 1 || calls == 0 || calls > 2 {
			t.Errorf("%s: one vector with a copy: %d copies, %d ledger lookups; want 1 copy, its entry looked up", plan, copies, calls)
		}
	}
}
