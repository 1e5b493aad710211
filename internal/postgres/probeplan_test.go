package postgres_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

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
