package postgres_test

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// Data sizes; the defaults keep `make bench` to a few minutes on 2 cores.
// Full size (targets.md): -lethe.sessions=1000 (1M child rows, 400k vectors).
var (
	benchSessions    = flag.Int("lethe.sessions", 60, "P1: sessions in the store, each with 1,000 child rows (400 of them with 384-dim embeddings)")
	benchP2Sessions  = flag.Int("lethe.p2-sessions", 1000, "P2: sessions in one request (each with 20 child rows)")
	benchBatch       = flag.Int("lethe.batch", 100, "P2: sessions per transaction")
	benchSamplePairs = flag.Int("lethe.pairs", 10, "P1: sessions deleted by each method")
)

// seedBench writes n sessions with `rounds` rounds (with embeddings), as many
// facts, and extra artifacts and snapshots, generated in SQL.
func seedBench(t testing.TB, conn *pgx.Conn, prefix string, n, rounds, extra int, embeddings bool) []string {
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-0000-4000-8000-%012d", prefix, i)
	}
	emb := "NULL"
	if embeddings {
		emb = "(SELECT array_agg(sin(k * (g + 0.5) + u.ord))::vector FROM generate_series(1, 384) k)"
	}
	stmts := []string{
		`INSERT INTO memory.sessions (id, tenant_id, summary) SELECT id, 't1', 'bench' FROM unnest($1::uuid[]) id`,
		`INSERT INTO memory.rounds (session_id, round_index, user_text, content_sha256, embedding)
			SELECT u.id, g, 'round', md5(u.id::text || g), ` + emb + `
			FROM unnest($1::uuid[]) WITH ORDINALITY u(id, ord), generate_series(1, $2::int) g`,
		`INSERT INTO memory.facts (session_id, kind, content) SELECT id, 'learning', 'fact' FROM unnest($1::uuid[]) id, generate_series(1, $2::int)`,
		`INSERT INTO memory.artifacts (session_id, kind, artifact_ref) SELECT id, 'commit', 'abc' FROM unnest($1::uuid[]) id, generate_series(1, $2::int)`,
		`INSERT INTO memory.file_snapshots (session_id, path, content) SELECT id, 'f', 'x' FROM unnest($1::uuid[]) id, generate_series(1, $2::int)`,
	}
	for i, s := range stmts {
		var args []any
		switch i {
		case 0:
			args = []any{ids}
		case 1, 2:
			args = []any{ids, rounds}
		default:
			args = []any{ids, extra}
		}
		if _, err := conn.Exec(ctx, s, args...); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
	// What autovacuum does in production (the test clusters run without it):
	// statistics and the visibility map, so counts can use index-only scans.
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		t.Fatal(err)
	}
	return ids
}

// The raw baselines run on a plain pgx connection with pgx's and
// PostgreSQL's default settings, as any client would; Lethe runs on its own
// pool (postgres.Connect).

// BenchmarkP1DeleteOneSession compares the Deleted step's database work for
// one session (~1,000 child rows) with the raw cascade on identical data.
func BenchmarkP1DeleteOneSession(b *testing.B) {
	ctx := context.Background()
	dsn := migratedDB(b)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	start := time.Now()
	ids := seedBench(b, conn, "b1000000", *benchSessions, 400, 100, true)
	var childRows, vectors int64
	_ = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM memory.rounds) + (SELECT count(*) FROM memory.facts) + (SELECT count(*) FROM memory.artifacts) + (SELECT count(*) FROM memory.file_snapshots), (SELECT count(embedding) FROM memory.rounds)`).Scan(&childRows, &vectors)
	b.Logf("P1 data: %d sessions, %d child rows, %d vectors (384 dims, HNSW), seeded in %s", len(ids), childRows, vectors, time.Since(start).Round(time.Second))
	pairs := min(*benchSamplePairs, len(ids)/2)

	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	var raw, lethe, verify, probe time.Duration
	var probed int
	b.ResetTimer()
	for i := 0; i < pairs; i++ {
		rawID, letheID := ids[2*i], ids[2*i+1]
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `DELETE FROM memory.sessions WHERE id = $1`, rawID); err != nil {
			b.Fatal(err)
		}
		raw += time.Since(t0)

		req := erasure.Request{UID: fmt.Sprintf("bench-%d", i), SessionIDs: []string{letheID}}
		if _, err := e.Tombstone(ctx, req); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		res, err := e.Delete(ctx, req, 100, 8)
		if err != nil {
			b.Fatal(err)
		}
		lethe += time.Since(t1)
		t2 := time.Now()
		if _, err := e.Verify(ctx, req); err != nil {
			b.Fatal(err)
		}
		verify += time.Since(t2)
		t3 := time.Now()
		if _, err := e.ProbeResidue(ctx, res.Probe, 1e-6); err != nil {
			b.Fatal(err)
		}
		probe += time.Since(t3)
		probed += len(res.Probe)
	}
	b.StopTimer()
	n := time.Duration(pairs)
	b.ReportMetric(float64((raw/n).Microseconds())/1000, "raw-ms/session")
	b.ReportMetric(float64((lethe/n).Microseconds())/1000, "lethe-ms/session")
	b.ReportMetric(float64(lethe)/float64(raw), "ratio")
	b.ReportMetric(float64((verify/n).Microseconds())/1000, "verify-ms")
	b.ReportMetric(float64((probe/n).Microseconds())/1000, "probe-ms")
	b.Logf("P1: %d sessions each way; lethe/raw = %.2f (target <= 1.2); verification %s, residue probe of %d embeddings %s per session",
		pairs, float64(lethe)/float64(raw), verify/n, probed/pairs, probe/n)
}

// BenchmarkP2OneThousandSessions compares one request with many sessions
// with the raw cascade of the same number of sessions in the same batch size.
func BenchmarkP2OneThousandSessions(b *testing.B) {
	ctx := context.Background()
	dsn := migratedDB(b)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	n := *benchP2Sessions
	rawIDs := seedBench(b, conn, "b2000000", n, 8, 2, false)
	letheIDs := seedBench(b, conn, "b3000000", n, 8, 2, false)
	b.Logf("P2 data: 2 x %d sessions, 20 child rows each, batches of %d", n, *benchBatch)
	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	b.ResetTimer()
	t0 := time.Now()
	for start := 0; start < n; start += *benchBatch {
		if _, err := conn.Exec(ctx, `DELETE FROM memory.sessions WHERE id = ANY($1::uuid[])`, rawIDs[start:min(start+*benchBatch, n)]); err != nil {
			b.Fatal(err)
		}
	}
	raw := time.Since(t0)
	req := erasure.Request{UID: "bench-p2", SessionIDs: letheIDs}
	if _, err := e.Tombstone(ctx, req); err != nil {
		b.Fatal(err)
	}
	t1 := time.Now()
	res, err := e.Delete(ctx, req, *benchBatch, 0)
	if err != nil {
		b.Fatal(err)
	}
	lethe := time.Since(t1)
	b.StopTimer()
	if len(res.Batches) != (n+*benchBatch-1) / *benchBatch {
		b.Fatalf("%d batches", len(res.Batches))
	}
	b.ReportMetric(float64(raw.Microseconds())/1000, "raw-ms")
	b.ReportMetric(float64(lethe.Microseconds())/1000, "lethe-ms")
	b.ReportMetric(float64(lethe)/float64(raw), "ratio")
	b.Logf("P2: %d sessions in %d transactions: raw %s, lethe %s, lethe/raw = %.2f (target <= 1.3)", n, len(res.Batches), raw, lethe, float64(lethe)/float64(raw))
}
