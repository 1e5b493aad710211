package postgres_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/benchreport"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/redact/redacttest"
)

// Data sizes; the defaults keep `make bench` to a few minutes on 2 cores.
// Full size (targets.md): -lethe.sessions=1000 (1M child rows, 400k vectors).
var (
	benchSessions    = flag.Int("lethe.sessions", 60, "P1: sessions in the store, each with 1,000 child rows (400 of them with 384-dim embeddings)")
	benchP2Sessions  = flag.Int("lethe.p2-sessions", 1000, "P2: sessions in one request (each with 20 child rows)")
	benchBatch       = flag.Int("lethe.batch", 100, "P2: sessions per transaction")
	benchSamplePairs = flag.Int("lethe.pairs", 9, "P1: sessions deleted by each method (a multiple of 3: each goes first as often)")
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
	// Each round deletes one session raw, one by Lethe without the residue
	// sample (probe budget 0) and one with it; one more is the warm-up.
	rounds := min(*benchSamplePairs, (len(ids)-1)/3)

	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	// The first deletion after a start takes the long way (it audits the
	// schema in its transaction); the ones after it, the steady state the
	// targets are about, take the short way. It is timed on its own.
	cold := coldDelete(b, e, ids[len(ids)-1])
	var raw, unsampled, lethe, verify, probe time.Duration
	var probed int
	var vacuums []time.Duration
	// Every session is read before the loop, as a grace period before its
	// deletion would: the raw ones by a plan, which reads what a tombstone
	// reads, so that neither way finds the other's pages warmer.
	bare := make([]erasure.Request, rounds)
	sampled := make([]erasure.Request, rounds)
	for i := range rounds {
		if _, err := e.Plan(ctx, erasure.Request{UID: fmt.Sprintf("bench-raw-%d", i), SessionIDs: []string{ids[3*i]}}); err != nil {
			b.Fatal(err)
		}
		bare[i] = erasure.Request{UID: fmt.Sprintf("bench-bare-%d", i), SessionIDs: []string{ids[3*i+1]}}
		sampled[i] = erasure.Request{UID: fmt.Sprintf("bench-%d", i), SessionIDs: []string{ids[3*i+2]}}
		for _, req := range []erasure.Request{bare[i], sampled[i]} {
			if _, err := e.Tombstone(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for i := 0; i < rounds; i++ {
		var res erasure.DeleteResult
		ways := []func(){
			func() {
				t0 := time.Now()
				if _, err := conn.Exec(ctx, `DELETE FROM memory.sessions WHERE id = $1`, ids[3*i]); err != nil {
					b.Fatal(err)
				}
				raw += time.Since(t0)
			},
			func() {
				t0 := time.Now()
				if _, err := e.Delete(ctx, bare[i], 100, 0); err != nil {
					b.Fatal(err)
				}
				unsampled += time.Since(t0)
			},
			func() {
				t0 := time.Now()
				var err error
				if res, err = e.Delete(ctx, sampled[i], 100, 8); err != nil {
					b.Fatal(err)
				}
				lethe += time.Since(t0)
			},
		}
		// Each way goes first, second and third equally often: the first
		// deletion of a round finds the shared index pages the coldest.
		for k := range ways {
			ways[(i+k)%len(ways)]()
		}
		t2 := time.Now()
		if _, err := e.Verify(ctx, sampled[i], res.ContentKeys); err != nil {
			b.Fatal(err)
		}
		verify += time.Since(t2)
		t3 := time.Now()
		if _, err := e.ProbeResidue(ctx, res.Probe, 1e-6); err != nil {
			b.Fatal(err)
		}
		probe += time.Since(t3)
		probed += len(res.Probe)
		t4 := time.Now()
		if _, err := e.Vacuum(ctx, lethev1.VacuumLazy); err != nil {
			b.Fatal(err)
		}
		vacuums = append(vacuums, time.Since(t4))
	}
	b.StopTimer()
	slices.Sort(vacuums)
	n := time.Duration(rounds)
	b.ReportMetric(float64((raw/n).Microseconds())/1000, "raw-ms/session")
	b.ReportMetric(float64((lethe/n).Microseconds())/1000, "lethe-ms/session")
	b.ReportMetric(float64(lethe)/float64(raw), "ratio")
	b.ReportMetric(float64((verify/n).Microseconds())/1000, "verify-ms")
	b.ReportMetric(float64((probe/n).Microseconds())/1000, "probe-ms")
	b.ReportMetric(float64(vacuums[len(vacuums)/2].Microseconds())/1000, "vacuum-ms")
	setting := fmt.Sprintf("%d sessions, %d child rows, %d vectors (HNSW); %d sessions each way", len(ids), childRows, vectors, rounds)
	benchreport.Record(b, benchreport.Row{ID: "P1", Figure: "delete of one session (~1,000 child rows) / raw cascade", Setting: setting,
		Unit: "×", Runs: []float64{float64(lethe) / float64(raw)}, Target: 1.10, HasTarget: true})
	benchreport.Record(b, benchreport.Row{ID: "P1", Figure: fmt.Sprintf("whole Deleted step (delete + verification + residue probe of %d embeddings) / raw cascade", probed/rounds),
		Setting: setting, Unit: "×", Runs: []float64{float64(lethe+verify+probe) / float64(raw)}, Target: 1.5, HasTarget: true})
	benchreport.Record(b, benchreport.Row{ID: "P1", Figure: "delete of one session without the residue sample (probe budget 0) / raw cascade", Setting: setting,
		Unit: "×", Runs: []float64{float64(unsampled) / float64(raw)}})
	benchreport.Record(b, benchreport.Row{ID: "P1", Figure: "raw cascade, one session", Setting: setting, Unit: "ms", Runs: []float64{ms(raw / n)}})
	benchreport.Record(b, benchreport.Row{ID: "P1", Figure: "first deletion after a start (long way: schema audit in its transaction) / raw cascade",
		Setting: setting + "; one session", Unit: "×", Runs: []float64{float64(cold) / float64(raw/n)}})
	b.Logf("P1: %d sessions each way; lethe/raw = %.2f (without the residue sample %.2f); verification %s, residue probe of %d embeddings %s per session; batches by way %+v (the first the untimed warm-up, %s)",
		rounds, float64(lethe)/float64(raw), float64(unsampled)/float64(raw), verify/n, probed/rounds, probe/n, e.Ways(), cold)
	b.Logf("P1 vacuum (lazy, the tables the deletion touched) after each erased session: median %s (min %s, max %s; %.2f× the raw delete's mean)",
		vacuums[len(vacuums)/2], vacuums[0], vacuums[len(vacuums)-1], float64(vacuums[len(vacuums)/2])/float64(raw/n))
}

// coldDelete tombstones and deletes the session id (grace 0) with an
// Eraser that has not deleted before, and returns the time the deletion
// took: the long way, which leaves the Eraser on the short way.
func coldDelete(b *testing.B, e *postgres.Eraser, id string) time.Duration {
	ctx := context.Background()
	req := erasure.Request{UID: "bench-warm-up", SessionIDs: []string{id}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if _, err := e.Delete(ctx, req, 100, 8); err != nil {
		b.Fatal(err)
	}
	took := time.Since(t0)
	if w := e.Ways(); w.Long != 1 || w.Short != 0 {
		b.Fatalf("the first deletion took the ways %+v, want the long way once", w)
	}
	return took
}

// p2Runs counts BenchmarkP2OneThousandSessions' runs in this process.
var p2Runs int

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
	letheIDs := seedBench(b, conn, "b3000000", n+1, 8, 2, false)
	warmUp := letheIDs[n]
	letheIDs = letheIDs[:n]
	b.Logf("P2 data: 2 x %d sessions, 20 child rows each, batches of %d", n, *benchBatch)
	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	// As in P1: the steady state, after a first deletion took the long way,
	// and the raw sessions read by a plan as the tombstone reads Lethe's.
	coldDelete(b, e, warmUp)
	if _, err := e.Plan(ctx, erasure.Request{UID: "bench-p2-raw", SessionIDs: rawIDs}); err != nil {
		b.Fatal(err)
	}
	req := erasure.Request{UID: "bench-p2", SessionIDs: letheIDs}
	if _, err := e.Tombstone(ctx, req); err != nil {
		b.Fatal(err)
	}
	// The grace period is an hour at least: autovacuum (off in the test
	// server) has analyzed every table by the deletion, the ledger's new
	// rows included, so the deletion's one-time ANALYZE of a ledger without
	// statistics is not part of the steady state.
	if _, err := conn.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	// The two ways alternate which goes first from one run to the next
	// (-count): the second finds the shared indexes and the WAL warmer.
	p2Runs++
	letheFirst := p2Runs%2 == 0
	var raw, lethe time.Duration
	var res erasure.DeleteResult
	rawWay := func() {
		t0 := time.Now()
		for start := 0; start < n; start += *benchBatch {
			if _, err := conn.Exec(ctx, `DELETE FROM memory.sessions WHERE id = ANY($1::uuid[])`, rawIDs[start:min(start+*benchBatch, n)]); err != nil {
				b.Fatal(err)
			}
		}
		raw = time.Since(t0)
	}
	letheWay := func() {
		t1 := time.Now()
		if res, err = e.Delete(ctx, req, *benchBatch, 0); err != nil {
			b.Fatal(err)
		}
		lethe = time.Since(t1)
	}
	b.ResetTimer()
	if letheFirst {
		letheWay()
		rawWay()
	} else {
		rawWay()
		letheWay()
	}
	b.StopTimer()
	if len(res.Batches) != (n+*benchBatch-1) / *benchBatch {
		b.Fatalf("%d batches", len(res.Batches))
	}
	// The pool's connections flush their table counters as they close.
	pool.Close()
	// Two updates per session, with the warm-up's.
	upd, hot := ledgerUpdateCounters(b, conn, 2*int64(n+1))
	var heapKB, indexKB int64
	if err := conn.QueryRow(ctx, `SELECT pg_table_size('lethe.erasure_ledger') / 1024, pg_indexes_size('lethe.erasure_ledger') / 1024`).Scan(&heapKB, &indexKB); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(raw.Microseconds())/1000, "raw-ms")
	b.ReportMetric(float64(lethe.Microseconds())/1000, "lethe-ms")
	b.ReportMetric(float64(lethe)/float64(raw), "ratio")
	benchreport.Record(b, benchreport.Row{ID: "P2", Figure: "one request's Deleted step / raw cascade in the same batches",
		Setting: fmt.Sprintf("%d sessions of 20 child rows, batches of %d", n, *benchBatch), Unit: "×",
		Runs: []float64{float64(lethe) / float64(raw)}, Target: 1.10, HasTarget: true})
	b.Logf("P2: %d sessions in %d transactions: raw %s, lethe %s (Lethe first: %v); batches by way %+v; ledger rows updated %d, on their page (HOT) %d; ledger %d kB, its indexes %d kB",
		n, len(res.Batches), raw, lethe, letheFirst, e.Ways(), upd, hot, heapKB, indexKB)
}

var (
	benchTextSessions = flag.Int("lethe.text-sessions", 30, "P1 text: sessions in the store, each with 400 rounds and 400 facts of text, 100 artifacts, 100 snapshots")
	benchTextNotes    = flag.Int("lethe.text-notes", 20000, "P1 text: rows of ~150 words (about 1 kB) in public.notes, outside the cascade")
)

// benchWords writes synthetic text: words of 2-9 letters from a vocabulary
// of 5,000, Zipf-distributed as a language's are.
type benchWords struct {
	rng   *rand.Rand
	zipf  *rand.Zipf
	vocab []string
}

func newBenchWords(seed int64) *benchWords {
	rng := rand.New(rand.NewSource(seed))
	w := &benchWords{rng: rng, zipf: rand.NewZipf(rng, 1.1, 2, 4999), vocab: make([]string, 5000)}
	for i := range w.vocab {
		b := make([]byte, 2+rng.Intn(8))
		for j := range b {
			b[j] = byte('a' + rng.Intn(26))
		}
		w.vocab[i] = string(b)
	}
	return w
}

// text is n to 2n words.
func (w *benchWords) text(n int) string {
	out := make([]string, n+w.rng.Intn(n+1))
	for i := range out {
		out[i] = w.vocab[w.zipf.Uint64()]
	}
	return strings.Join(out, " ")
}

// seedTextBench writes n sessions of text (the P1 shape: 1,000 child rows,
// 800 of them with text) and notes rows outside the cascade, one of them a
// verbatim copy of the first round of each session. It returns the
// sessions and the size of the text outside the cascade.
func seedTextBench(t testing.TB, conn *pgx.Conn, n, notes int) ([]string, int64) {
	ctx := context.Background()
	w := newBenchWords(1)
	ids := make([]string, n)
	var rounds, facts, noteRows [][]any
	for i := range ids {
		ids[i] = fmt.Sprintf("b4000000-0000-4000-8000-%012d", i)
		for r := 0; r < 400; r++ {
			rounds = append(rounds, []any{ids[i], r, w.text(40), w.text(60)})
			facts = append(facts, []any{ids[i], "learning", w.text(20)})
		}
		noteRows = append(noteRows, []any{i, "Quoted from a chat: " + rounds[len(rounds)-400][2].(string)})
	}
	for i := len(noteRows); i < notes; i++ {
		noteRows = append(noteRows, []any{i, w.text(100)})
	}
	// Without the cascade's vector columns a deletion with a probe budget
	// differs from one without by the text sample alone.
	mustExecTB(t, conn, `ALTER TABLE memory.sessions DROP COLUMN summary_embedding`)
	mustExecTB(t, conn, `ALTER TABLE memory.rounds DROP COLUMN embedding`)
	mustExecTB(t, conn, `ALTER TABLE memory.facts DROP COLUMN embedding`)
	mustExecTB(t, conn, `INSERT INTO memory.sessions (id, tenant_id, summary) SELECT id, 't1', 'bench' FROM unnest($1::uuid[]) id`, ids)
	mustExecTB(t, conn, `CREATE TABLE public.notes (id int, body text)`)
	for _, c := range []struct {
		table []string
		cols  []string
		rows  [][]any
	}{
		{[]string{"memory", "rounds"}, []string{"session_id", "round_index", "user_text", "assistant_text"}, rounds},
		{[]string{"memory", "facts"}, []string{"session_id", "kind", "content"}, facts},
		{[]string{"public", "notes"}, []string{"id", "body"}, noteRows},
	} {
		if _, err := conn.CopyFrom(ctx, c.table, c.cols, pgx.CopyFromRows(c.rows)); err != nil {
			t.Fatalf("seed %v: %v", c.table, err)
		}
	}
	mustExecTB(t, conn, `INSERT INTO memory.artifacts (session_id, kind, artifact_ref) SELECT id, 'commit', 'abc' FROM unnest($1::uuid[]) id, generate_series(1, 100)`, ids)
	mustExecTB(t, conn, `INSERT INTO memory.file_snapshots (session_id, path, content) SELECT id, 'f', 'x' FROM unnest($1::uuid[]) id, generate_series(1, 100)`, ids)
	mustExecTB(t, conn, `VACUUM ANALYZE`)
	var size int64
	if err := conn.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'r' AND n.nspname IN ('public', 'memory_derived', 'lethe')`).Scan(&size); err != nil {
		t.Fatal(err)
	}
	return ids, size
}

func mustExecTB(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", firstLine(sql), err)
	}
}

// textBenchTimes are the durations of each session of BenchmarkP1TextProbe.
type textBenchTimes struct{ raw, unsampled, sampled, probe []time.Duration }

// BenchmarkP1TextProbe measures the text residue probe on the P1 shape: the
// deletion of one session (~1,000 child rows, 800 with text) raw, by Lethe
// without a probe sample (budget 0) and with one (the text sample: the
// cascade has no vector column here), then the text probe of the sample
// over the text outside the cascade; ratios against the raw delete, and
// the spread over the sessions.
func BenchmarkP1TextProbe(b *testing.B) {
	ctx := context.Background()
	dsn := migratedDB(b)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	start := time.Now()
	ids, outside := seedTextBench(b, conn, *benchTextSessions, *benchTextNotes)
	b.Logf("P1 text data: %d sessions of 1,000 child rows; %.1f MB of tables outside the cascade (public.notes: %d rows of ~1 kB); seeded in %s",
		len(ids), float64(outside)/1e6, *benchTextNotes, time.Since(start).Round(time.Second))
	pool, err := postgres.Connect(ctx, dsn, postgres.Options{Vector: true})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	var ts textBenchTimes
	var passages int
	b.ResetTimer()
	for i := 0; i+2 < len(ids) && i/3 < *benchSamplePairs; i += 3 {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, `DELETE FROM memory.sessions WHERE id = $1`, ids[i]); err != nil {
			b.Fatal(err)
		}
		ts.raw = append(ts.raw, time.Since(t0))
		for k, budget := range []int{0, 64} {
			req := erasure.Request{UID: fmt.Sprintf("bench-text-%d", i+1+k), SessionIDs: []string{ids[i+1+k]}}
			if _, err := e.Tombstone(ctx, req); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			res, err := e.Delete(ctx, req, 100, budget)
			if err != nil {
				b.Fatal(err)
			}
			if budget == 0 {
				ts.unsampled = append(ts.unsampled, time.Since(t1))
				continue
			}
			ts.sampled = append(ts.sampled, time.Since(t1))
			t2 := time.Now()
			tp, err := e.ProbeTextResidue(ctx, res.Texts)
			if err != nil {
				b.Fatal(err)
			}
			ts.probe = append(ts.probe, time.Since(t2))
			passages += len(res.Texts)
			if len(tp.Residue) != 1 || tp.Residue[0].Column != "public.notes.body" {
				b.Fatalf("text residue %+v: want the copy of the session's first round in public.notes.body", tp.Residue)
			}
		}
	}
	b.StopTimer()
	ts.report(b, passages, outside)
}

func (ts textBenchTimes) report(b *testing.B, passages int, outside int64) {
	// Medians: the machine is shared, and one slow session moves a mean.
	raw, unsampled, sampled, probe := median(ts.raw), median(ts.unsampled), median(ts.sampled), median(ts.probe)
	perProbe := float64(passages) / float64(len(ts.probe))
	b.ReportMetric(ms(raw), "raw-ms/session")
	b.ReportMetric(ms(unsampled), "lethe-ms/session")
	b.ReportMetric(ms(sampled), "lethe-sampled-ms/session")
	b.ReportMetric(float64(sampled)/float64(raw), "ratio")
	b.ReportMetric(ms(probe), "textprobe-ms")
	b.ReportMetric(float64(probe)/float64(raw), "textprobe/raw")
	b.ReportMetric(ms(probe)/perProbe/(float64(outside)/1e6), "textprobe-ms/passage/MB")
	b.Logf("P1 text: %d sessions each way, medians; delete raw %s (%s-%s), lethe %s (lethe/raw %.2f), with the text sample %s (lethe/raw %.2f); "+
		"text probe of %.0f passages over %.1f MB: %s (%s-%s), %.1fx the raw delete",
		len(ts.raw), raw, slices.Min(ts.raw), slices.Max(ts.raw), unsampled, float64(unsampled)/float64(raw), sampled, float64(sampled)/float64(raw),
		perProbe, float64(outside)/1e6, probe, slices.Min(ts.probe), slices.Max(ts.probe), float64(probe)/float64(raw))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkRedactionTriggerPerRow times inserting rounds with reasoning
// text (the regression corpus's traces, each with 2–6 planted values or
// look-alikes) with the redaction trigger and, in the same run on the same
// rows, without it.
func BenchmarkRedactionTriggerPerRow(b *testing.B) {
	ctx := context.Background()
	dsn := migratedDB(b)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	const rows = 2000
	corpus := redacttest.Corpus(3, rows)
	texts := make([]string, rows)
	for i, tr := range corpus {
		texts[i] = tr.Text
	}
	ids := seedBench(b, conn, "0000beef", 1, 0, 0, false)
	// A trigger that only returns the row: what calling a PL/pgSQL row
	// trigger costs, the most a C extension doing the same regular
	// expression work through PostgreSQL's engine could save.
	if _, err := conn.Exec(ctx, `CREATE FUNCTION public.bench_return_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
		CREATE TRIGGER bench_return_row BEFORE INSERT OR UPDATE ON memory.rounds FOR EACH ROW EXECUTE FUNCTION public.bench_return_row();
		ALTER TABLE memory.rounds DISABLE TRIGGER bench_return_row`); err != nil {
		b.Fatal(err)
	}
	type mode struct{ redact, empty string }
	insert := func(m mode) time.Duration {
		b.Helper()
		for _, s := range []string{`DELETE FROM memory.rounds`,
			`ALTER TABLE memory.rounds ` + m.redact + ` TRIGGER lethe_redact_assistant_thinking`,
			`ALTER TABLE memory.rounds ` + m.empty + ` TRIGGER bench_return_row`} {
			if _, err := conn.Exec(ctx, s); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		if _, err := conn.Exec(ctx, `INSERT INTO memory.rounds (session_id, round_index, user_text, assistant_thinking)
			SELECT $1, i, 'q', t FROM unnest($2::text[]) WITH ORDINALITY u(t, i)`, ids[0], texts); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	none, empty, redacting := mode{"DISABLE", "DISABLE"}, mode{"DISABLE", "ENABLE ALWAYS"}, mode{"ENABLE ALWAYS", "DISABLE"}
	insert(redacting) // warm the caches and the compiled expressions
	without, withEmpty, with := insert(none), insert(empty), insert(redacting)
	if n := count(b, conn, `SELECT count(*) FROM memory.rounds WHERE assistant_thinking LIKE '%[email]%'`); n == 0 {
		b.Fatal("no round was redacted: the trigger did not run")
	}
	setting := fmt.Sprintf("%d rounds of reasoning text (%d–%d bytes), one INSERT", rows, minLen(texts), maxLen(texts))
	benchreport.Record(b, benchreport.Row{ID: "R19", Figure: "insert with the redaction trigger / without it", Setting: setting, Unit: "×",
		Runs: []float64{with.Seconds() / without.Seconds()}})
	benchreport.Record(b, benchreport.Row{ID: "R19", Figure: "redaction trigger, added time per row", Setting: setting, Unit: "µs",
		Runs: []float64{float64((with - without).Microseconds()) / rows}})
	benchreport.Record(b, benchreport.Row{ID: "R19", Figure: "share of that time a PL/pgSQL trigger returning the row costs", Setting: setting, Unit: "%",
		Runs: []float64{100 * (withEmpty - without).Seconds() / (with - without).Seconds()}})
}

func minLen(s []string) int {
	return len(slices.MinFunc(s, func(a, b string) int { return len(a) - len(b) }))
}

func maxLen(s []string) int {
	return len(slices.MaxFunc(s, func(a, b string) int { return len(a) - len(b) }))
}
