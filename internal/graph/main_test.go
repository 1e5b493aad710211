package graph_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/testenv"
)

var (
	fdb    *testenv.FalkorDB
	pg     *testenv.Postgres
	graphs atomic.Int64
)

func TestMain(m *testing.M) {
	var err error
	fdb, err = testenv.StartFalkorDB()
	if err != nil {
		// A missing service is a failure with the command to run, never a skip.
		fmt.Fprintln(os.Stderr, "FAIL: cannot start FalkorDB for the tests:", err)
		os.Exit(1)
	}
	pg, err = testenv.StartPostgres()
	if err != nil {
		fdb.Stop()
		fmt.Fprintln(os.Stderr, "FAIL: cannot start PostgreSQL for the tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Stop()
	fdb.Stop()
	os.Exit(code)
}

// freshGraph returns an empty graph of its own on the test server.
func freshGraph(t testing.TB) *graph.Graph {
	t.Helper()
	c, err := graph.Open(fdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.Graph(fmt.Sprintf("test%d", graphs.Add(1)))
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// snapshot is every element of a graph as comparable strings.
type snapshot = map[string]int

func elementsOf(t testing.TB, ctx context.Context, g *graph.Graph) snapshot {
	t.Helper()
	out, err := testenv.GraphElements(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bulkGraph seeds sessions with facts (fixture.SeedBulk) into a fresh
// migrated database and derives their graph into a fresh graph. The
// connection is closed when the test ends.
func bulkGraph(tb testing.TB, tenant string, sessions, facts, entities int) (*pgx.Conn, []string, *graph.Graph) {
	tb.Helper()
	ctx := context.Background()
	dsn, err := pg.MigratedDatabase(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(ctx) })
	ids, err := fixture.SeedBulk(ctx, conn, "memory", tenant, sessions, facts, entities)
	if err != nil {
		tb.Fatal(err)
	}
	g := freshGraph(tb)
	if err := fixture.DeriveGraph(ctx, conn, "memory", g); err != nil {
		tb.Fatal(err)
	}
	return conn, ids, g
}
