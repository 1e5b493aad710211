package postgres_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/benchreport"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

var benchCacheSessions = flag.Int("lethe.cache-sessions", 50, "verification bench: sessions in the store, each with 400 rounds whose content is in the embedding cache")

// BenchmarkVerifyContentIndex times the Deleted step's verification of one
// session (400 rounds, their content cached) in a store whose embedding
// cache holds an entry for every round's content: with the content keys
// the deletion read (the cache looked up by them), and without (a manager
// restarted between deleting and verifying: every cache entry hashed).
// The baseline is the raw cascade of one session of the same store.
func BenchmarkVerifyContentIndex(b *testing.B) {
	ctx := context.Background()
	dsn := migratedDB(b)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	ids := seedBench(b, conn, "c1000000", *benchCacheSessions, 400, 0, false)
	// The cache's HNSW index is dropped: neither the verification nor the
	// deletion of an entry reads it, and building it would take most of
	// the bench's time.
	for _, s := range []string{
		`DROP INDEX memory_derived.embedding_cache_embedding_hnsw`,
		`INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids)
			SELECT content_sha256, 'cached', array_fill(0.1, ARRAY[384])::vector, ARRAY['t1'] FROM memory.rounds`,
		`VACUUM ANALYZE memory_derived.embedding_cache`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
	var entries int64
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM memory_derived.embedding_cache`).Scan(&entries)
	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	coldDelete(b, e, ids[len(ids)-1])
	rounds := min(*benchSamplePairs, (len(ids)-1)/2)
	reqs := make([]erasure.Request, rounds)
	for i := range rounds {
		reqs[i] = erasure.Request{UID: fmt.Sprintf("bench-verify-%d", i), SessionIDs: []string{ids[2*i+1]}}
		if _, err := e.Tombstone(ctx, reqs[i]); err != nil {
			b.Fatal(err)
		}
		if _, err := e.Plan(ctx, erasure.Request{UID: "bench-raw", SessionIDs: []string{ids[2*i]}}); err != nil {
			b.Fatal(err)
		}
	}
	var raw, keyed, scanned []time.Duration
	b.ResetTimer()
	for i := range rounds {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `DELETE FROM memory.sessions WHERE id = $1`, ids[2*i]); err != nil {
			b.Fatal(err)
		}
		raw = append(raw, time.Since(t0))
		res, err := e.Delete(ctx, reqs[i], 100, 0)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.ContentKeys) != 400 {
			b.Fatalf("the deletion kept %d content keys, want the session's 400", len(res.ContentKeys))
		}
		// Each way goes first as often: the first finds the pages colder.
		ways := []func(){
			func() { keyed = append(keyed, timeVerify(b, e, reqs[i], res.ContentKeys)) },
			func() { scanned = append(scanned, timeVerify(b, e, reqs[i], nil)) },
		}
		for k := range ways {
			ways[(i+k)%len(ways)]()
		}
	}
	b.StopTimer()
	mid := func(ds []time.Duration) time.Duration { s := slices.Clone(ds); slices.Sort(s); return s[len(s)/2] }
	setting := fmt.Sprintf("%d sessions of 400 rounds, %d cache entries; one session (400 cached contents) verified, %d sessions", len(ids), entries, rounds)
	benchreport.Record(b, benchreport.Row{ID: "P1", Figure: "verification of one deleted session with the deletion's content keys / raw cascade",
		Setting: setting, Unit: "×", Runs: []float64{float64(mid(keyed)) / float64(mid(raw))}})
	benchreport.Record(b, benchreport.Row{ID: "P1", Figure: "the same verification without content keys (every cache entry hashed) / raw cascade",
		Setting: setting, Unit: "×", Runs: []float64{float64(mid(scanned)) / float64(mid(raw))}})
	b.ReportMetric(ms(mid(raw)), "raw-ms")
	b.ReportMetric(ms(mid(keyed)), "verify-keyed-ms")
	b.ReportMetric(ms(mid(scanned)), "verify-scan-ms")
	b.Logf("verification of one session, %d cache entries: with the deletion's keys %s, every entry hashed %s; raw cascade %s (medians of %d)",
		entries, mid(keyed), mid(scanned), mid(raw), rounds)
}

// timeVerify verifies req with keys, fails unless nothing is left, and
// returns the time it took.
func timeVerify(b *testing.B, e *postgres.Eraser, req erasure.Request, keys erasure.ContentKeys) time.Duration {
	t0 := time.Now()
	checks, err := e.Verify(context.Background(), req, keys)
	took := time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range checks {
		if c.Found != 0 {
			b.Fatalf("after the deletion: %s = %d", c.Check, c.Found)
		}
	}
	return took
}
