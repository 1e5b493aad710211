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
