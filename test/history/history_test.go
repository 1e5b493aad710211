package history

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/benchreport"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/testenv"
)

func keyOf(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// faults counts what was injected.
type faults struct {
	mu                        sync.Mutex
	kills, dbDrops, graphRest int
	// restores of the database; request objects deleted before one; stores
	// whose audit reported the restore (RestoreDetected).
	restores, requestsDeleted, restoresDetected int
	// re-ingestion attempts refused (LE002) and accepted.
	refused, accepted int
	// runs' Backups Velero failed and the harness took again.
	backupsRetaken int
	// FalkorDB starts that did not answer and were started again.
	graphHungStarts int
}

func (f *faults) countBackupRetaken() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.backupsRetaken++
}

func (f *faults) countReingestion(a reingestion) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if a.Refused {
		f.refused++
	} else {
		f.accepted++
	}
}

func (f *faults) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("%d manager kills (SIGKILL), %d database connection drops, %d FalkorDB restarts, "+
		"%d database restores (%d after deleting a completed request object; %d stores' audits saw one), "+
		"%d re-ingestion attempts refused (LE002) and %d accepted; %d runs' Backups failed by Velero and taken again; "+
		"%d FalkorDB starts that did not answer and were started again",
		f.kills, f.dbDrops, f.graphRest, f.restores, f.requestsDeleted, f.restoresDetected, f.refused, f.accepted, f.backupsRetaken, f.graphHungStarts)
}

// envFloat reads a probability (0 is allowed: the fault is off).
func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && v >= 0 && v <= 1 {
		return v
	}
	return def
}

// TestRandomizedFaultHistories runs LETHE_HISTORY_RUNS scenarios (default 6:
// the short mode of `make test`; `make history` runs HISTORY_RUNS), in
// rounds of LETHE_HISTORY_PER_ROUND concurrent runs (see historyPass).
// LETHE_HISTORY_SEED replays a seed.
func TestRandomizedFaultHistories(t *testing.T) {
	total := envInt("LETHE_HISTORY_RUNS", 6)
	seed := uint64(envInt("LETHE_HISTORY_SEED", int(time.Now().UnixNano()%1e9)))
	t.Logf("seed %d (replay with LETHE_HISTORY_SEED=%d)", seed, seed)
	res := historyPass(t, total, envInt("LETHE_HISTORY_PER_ROUND", 3), seed)
	for _, v := range res.violations {
		t.Error(v)
	}
	f := res.faults
	if f.kills == 0 {
		t.Error("no manager was killed: the faults did not run")
	}
	if res.runs == total && res.restoreProb > 0 && f.restores == 0 {
		t.Error("no database was restored: the restore fault did not run")
	}
	if res.runs == total && (f.refused == 0 || f.accepted == 0) {
		t.Errorf("re-ingestion attempts: %d refused, %d accepted; each outcome must have been checked", f.refused, f.accepted)
	}
}

// BenchmarkR13HistoryChecker times LETHE_BENCH_HISTORY_RUNS runs (default
// 60) of the history checker, faults, checks and runs per round as in
// `make history` (LETHE_HISTORY_PER_ROUND, default 10), and
// reports the time 10,000 runs take at that rate (R13: ≤ 2 h).
func BenchmarkR13HistoryChecker(b *testing.B) {
	total := envInt("LETHE_BENCH_HISTORY_RUNS", 60)
	seed := uint64(envInt("LETHE_HISTORY_SEED", int(time.Now().UnixNano()%1e9)))
	for range b.N {
		res := historyPass(b, total, envInt("LETHE_HISTORY_PER_ROUND", 10), seed)
		if len(res.violations) > 0 {
			b.Fatalf("seed %d: %d violations, the first: %s", seed, len(res.violations), res.violations[0])
		}
		perRun := res.elapsed.Seconds() / float64(res.runs)
		// The seed is logged, not in the setting: the rows of the counts
		// (each its own seed) are one figure's runs.
		b.Logf("R13: runs %d–%d of this process, seed %d (replay with LETHE_HISTORY_SEED=%d)", res.first, res.first+res.runs-1, seed, seed)
		setting := fmt.Sprintf("%d runs per count, %d per round, restore probability %.2f; a count's runs follow those of the counts before it, whose stores stay",
			res.runs, res.perRound, res.restoreProb)
		benchreport.Record(b, benchreport.Row{ID: "R13", Figure: "history checker: 10,000 runs at the measured rate", Setting: setting,
			Unit: "h", Runs: []float64{perRun * 10000 / 3600}, Target: 2, HasTarget: true})
		benchreport.Record(b, benchreport.Row{ID: "R13", Figure: "history checker: time per run", Setting: setting, Unit: "s", Runs: []float64{perRun}})
		benchreport.Record(b, benchreport.Row{ID: "R13", Figure: "history checker: API server requests per run (every client)", Setting: setting,
			Unit: "requests", Runs: []float64{res.api.Total() / float64(res.runs)}})
		benchreport.Record(b, benchreport.Row{ID: "R13", Figure: "history checker: Velero's deletion worker (one DeleteBackupRequest at a time) per run", Setting: setting,
			Unit: "s", Runs: []float64{res.phases.deleting.Seconds() / float64(res.runs)}})
		benchreport.Record(b, benchreport.Row{ID: "R13", Figure: "history checker: processor time per run (the checker and every process it started)", Setting: setting,
			Unit: "CPU s", Runs: []float64{res.cpu.Total() / float64(res.runs)}})
		benchreport.Record(b, benchreport.Row{ID: "R13", Figure: fmt.Sprintf("history checker: 10,000 runs' processor time at this rate, spread over %d cores (an estimate: the time if the cores never idled)", res.cpu.Cores),
			Setting: setting, Unit: "h", Runs: []float64{res.cpuSpread(10000).Hours()}})
	}
}

// passRuns numbers the runs of every pass in this process: a benchmark's
// next count must not reuse the run IDs of the one before, whose sessions
// it erased (their re-ingestion is refused) and whose namespaces it made.
var passRuns atomic.Int64

// phases adds up where a pass's rounds spend their time.
type phases struct {
	setup, requests, restore, finish time.Duration
	// deletions and deleting: the DeleteBackupRequests Velero processed and
	// the time its one deletion worker took (apiRecorder.deletions), within
	// the above. Requests under way when a round's recorder starts or stops
	// are not counted: a lower bound.
	deletions int
	deleting  time.Duration
}

func (ph *phases) String() string {
	return fmt.Sprintf("seeding and Backups %s, requests until done %s, restores until intact %s, checks %s; "+
		"within them, Velero's deletion worker (one DeleteBackupRequest at a time, Lethe's, its own garbage collector's and the clean-up's) %s for %d requests",
		ph.setup.Round(time.Second), ph.requests.Round(time.Second), ph.restore.Round(time.Second), ph.finish.Round(time.Second),
		ph.deleting.Round(time.Second), ph.deletions)
}

// passResult is what a pass of the history checker did.
type passResult struct {
	// first is the ID of the pass's first run (passRuns).
	first, runs, perRound int
	restoreProb           float64
	elapsed               time.Duration
	violations            []string
	faults                *faults
	phases                phases
	// api is what the API server served during the pass, to every client.
	api testenv.APIRequests
	// cpu is the processor time the pass used, by service, and the
	// machine's.
	cpu testenv.CPUUsage
}

// cpuSpread is the processor time runs runs use at this pass's rate per
// run, spread over every core the test may use: how long they would take
// if the cores never idled. An estimate, not a bound: part of that time
// (the API server's, the controllers' loops, the checker's polling) grows
// with the time a pass takes rather than with its runs, and the kernel's
// threads and processes outside the test are not in it.
func (res passResult) cpuSpread(runs int) time.Duration {
	if res.runs == 0 || res.cpu.Cores == 0 {
		return 0
	}
	return time.Duration(res.cpu.Total() / float64(res.runs) * float64(runs) / float64(res.cpu.Cores) * float64(time.Second))
}

// historyPass runs total scenarios in rounds of perRound concurrent runs,
// stopping after the first round with a
// violation. Each round injects faults at random moments until its
// requests are all done, and attempts to ingest the runs' transcripts
// again; a round in LETHE_HISTORY_RESTORE_PROB (default 0.3; the last round
// when none did before) then restores its database from a dump taken
// before its requests. Every run's recorded history is then checked.
func historyPass(tb testing.TB, total, perRound int, seed uint64) passResult {
	e := shared
	res := passResult{perRound: perRound, restoreProb: envFloat("LETHE_HISTORY_RESTORE_PROB", 0.3), faults: &faults{}}
	ctx := context.Background()

	db := &database{dsn: e.dsn}
	defer db.close(ctx)
	gc, err := graph.Open(e.fdb.URL())
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = gc.Close() }()

	mgr, err := e.startManager()
	if err != nil {
		tb.Fatal(err)
	}
	m := &managerHolder{e: e, p: mgr}
	defer m.stop()

	f := res.faults
	res.first = int(passRuns.Add(int64(total))) - total
	apiBefore, err := e.cp.APIRequests(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	cpuBefore, err := testenv.ReadCPU()
	if err != nil {
		tb.Fatal(err)
	}
	started := time.Now()
	for i := 0; res.runs < total; i++ {
		n := min(res.perRound, total-res.runs)
		r := &round{t: tb, e: e, db: db, gc: gc, m: m, f: f, seed: seed + uint64(i), first: res.first + res.runs, phases: &res.phases}
		rng := rand.New(rand.NewPCG(r.seed, restoreStream))
		if rng.Float64() < res.restoreProb || res.restoreProb > 0 && res.runs+n >= total && f.restores == 0 {
			r.restore = &restoreFault{file: filepath.Join(e.dir, fmt.Sprintf("round-%d.dump", i)), deleteOne: rng.IntN(2) == 0, rng: rng}
		}
		v, err := r.run(ctx, n)
		if err != nil {
			tb.Fatalf("round %d (seed %d): %v", i, r.seed, err)
		}
		res.violations = append(res.violations, v...)
		res.runs += n
		if i%10 == 9 {
			tb.Logf("%d runs, %s: %s so far", res.runs, time.Since(started).Round(time.Second), f)
		}
		if len(res.violations) > 0 {
			break
		}
	}
	res.elapsed = time.Since(started)
	cpuAfter, err := testenv.ReadCPU()
	if err != nil {
		tb.Fatal(err)
	}
	res.cpu = cpuAfter.Sub(cpuBefore)
	apiAfter, err := e.cp.APIRequests(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	res.api = apiAfter.Sub(apiBefore)
	tb.Logf("%d runs in %s: %s; %d violations", res.runs, res.elapsed.Round(time.Second), f, len(res.violations))
	tb.Logf("where the rounds' time went: %s", &res.phases)
	tb.Logf("API server requests, every client (a watch counted once it ended): %.0f (%.0f a run); the most: %s", res.api.Total(), res.api.Total()/float64(res.runs), res.api.Top(8))
	tb.Logf("processor time: %.0f s (%.2f s a run; 10,000 runs would keep %d cores busy for %.1f h), the machine %.0f%% busy; by process: %s",
		res.cpu.Total(), res.cpu.Total()/float64(res.runs), res.cpu.Cores, res.cpuSpread(10000).Hours(), 100*res.cpu.Busy(), &res.cpu)
	return res
}

// restoreStream is the random stream, beside the round's seed, that decides
// its restore.
const restoreStream = 0x7e570e

// managerHolder is the current manager process, replaced after each kill.
type managerHolder struct {
	mu sync.Mutex
	e  *env
	p  *testenv.ManagerProcess
}

func (m *managerHolder) kill(restartAfter time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Kill()
	time.Sleep(restartAfter)
	p, err := m.e.startManager()
	if err != nil {
		return err
	}
	m.p = p
	return nil
}

// alive fails when the manager exited on its own (a crash is a finding).
func (m *managerHolder) alive() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if done, err := m.p.Exited(); done {
		return fmt.Errorf("the manager exited by itself (%w): see its log", err)
	}
	return nil
}

func (m *managerHolder) stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Stop(10 * time.Second)
}

// round is one round of concurrent runs and what it shares.
type round struct {
	t     testing.TB
	e     *env
	db    *database
	gc    *graph.Client
	m     *managerHolder
	f     *faults
	seed  uint64
	first int
	seq   int64 // the last effect recorded before the round's requests
	// restore is nil when the round does not restore its database.
	restore *restoreFault
	// api records the round's API objects; its waits read their states.
	api *apiRecorder
	// phases adds up the round's time (the pass's).
	phases *phases
}

// setup seeds n runs and records what they hold first.
func (r *round) setup(ctx context.Context, n int) ([]*runPlan, map[*runPlan]runRecord, error) {
	plans := make([]*runPlan, n)
	before := map[*runPlan]runRecord{}
	err := r.db.do(ctx, func(conn *pgx.Conn) error {
		r.db.restored = false
		for i := range plans {
			p := newPlan(r.first+i, r.seed)
			plans[i] = p
			if err := seedRun(ctx, r.e, conn, r.gc.Graph(p.GraphKey), p); err != nil {
				return fmt.Errorf("seed run %d: %w", p.ID, err)
			}
			rec := runRecord{Plan: p}
			var err error
			if rec.GraphBefore, err = testenv.GraphElements(ctx, r.gc.Graph(p.GraphKey)); err != nil {
				return err
			}
			ids := append(slices.Clone(p.Own), p.Foreign)
			if rec.RowsBefore, err = rowsPerSession(ctx, conn, ids); err != nil {
				return err
			}
			if rec.CacheBefore, err = cachePerSession(ctx, conn, ids); err != nil {
				return err
			}
			before[p] = rec
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	// The round's Backups are taken together (Velero takes a round's worth
	// at once: see setup).
	var g errgroup.Group
	for _, p := range plans {
		g.Go(func() error { return backUp(ctx, r.t, r.e, r.f, p) })
	}
	return plans, before, g.Wait()
}

// run sets up n runs, starts the recorders, applies the requests, injects
// faults and re-ingestion attempts until every request is done (and, in a
// restore round, until the erasures hold again after the restore), and
// checks each run.
func (r *round) run(ctx context.Context, n int) ([]string, error) {
	e, first := r.e, r.first
	mark := time.Now()
	lap := func(d *time.Duration) {
		now := time.Now()
		*d += now.Sub(mark)
		mark = now
	}
	plans, before, err := r.setup(ctx, n)
	if err != nil {
		return nil, err
	}
	if err := r.db.do(ctx, func(conn *pgx.Conn) error {
		var err error
		r.seq, err = lastEffect(ctx, conn)
		return err
	}); err != nil {
		return nil, err
	}
	if r.restore != nil {
		if err := r.restore.dump(e, r.db); err != nil {
			return nil, err
		}
	}
	api, err := startAPIRecorder(ctx, e.k8s)
	if err != nil {
		return nil, err
	}
	r.api = api
	lap(&r.phases.setup)
	graphs := startGraphRecorder(ctx, e.fdb.Addr())

	// Cancels end with the requests; faults, re-ingestion and Velero go on
	// through a restore until the erasures hold again.
	cancelCtx, stopCancels := context.WithCancel(ctx)
	defer stopCancels()
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	start := time.Now()
	for _, p := range plans {
		if err := createRequests(ctx, e, p); err != nil {
			return nil, err
		}
		for _, pr := range p.Requests {
			if pr.CancelAfter > 0 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := cancelLater(cancelCtx, e, p, pr, start); err != nil && !errors.Is(err, context.Canceled) {
						errs <- err
					}
				}()
			}
		}
	}
	injected := make(chan struct{})
	go func() {
		defer close(injected)
		injectFaults(faultCtx, r.t, e, r.db, r.m, graphs, r.f, rand.New(rand.NewPCG(r.seed, uint64(first))))
	}()
	reingestions := &reingestLog{}
	reingestRNG := rand.New(rand.NewPCG(r.seed, uint64(first)+reingestStream))
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := reingestAtRandom(faultCtx, r.db, plans, reingestions, r.f, reingestRNG); err != nil {
			errs <- err
		}
	}()

	stop := func() {
		stopCancels()
		stopFaults()
		<-injected
		wg.Wait()
	}
	if pending, err := r.waitDone(ctx, plans); err != nil || pending != "" {
		activity := r.activity(ctx)
		stop()
		if err != nil {
			return nil, err
		}
		return []string{fmt.Sprintf("round of runs %d-%d: requests did not complete within 4 minutes: %s; the database's sessions then: %s",
			first, first+n-1, pending, activity)}, nil
	}
	stopCancels()
	lap(&r.phases.requests)
	var heldAt time.Time
	if r.restore != nil {
		if heldAt, err = r.restoreAndWait(ctx, plans); err != nil {
			stop()
			return nil, err
		}
	}
	stop()
	close(errs)
	for err := range errs {
		return nil, err
	}
	if r.restore != nil {
		if err := r.restore.waitIntact(ctx, e, r.api, r.db, plans, heldAt); err != nil {
			return nil, err
		}
	}
	lap(&r.phases.restore)
	defer lap(&r.phases.finish)
	return r.finish(ctx, plans, before, api, graphs, reingestions, reingestRNG)
}

// activity describes, for a report, the database's other sessions: who,
// in what state, waiting on what, for how long, running which statement
// (its text only: the values are parameters, never in it).
func (r *round) activity(ctx context.Context) string {
	var out []string
	err := r.db.do(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT format('%s pid %s %s%s, in transaction for %s: %s', usename, pid, state,
				coalesce(' waiting on ' || wait_event_type || '/' || wait_event, ''),
				coalesce(date_trunc('second', now() - xact_start)::text, '-'), left(regexp_replace(query, '\s+', ' ', 'g'), 120))
			FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY xact_start NULLS LAST`)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return err.Error()
	}
	return strings.Join(out, " | ")
}

// reingestStream is the random stream, beside the round's seed, of its
// re-ingestion attempts.
const reingestStream = 0x5ec0

// waitDone waits until every request is done (BackupsRotated or Cancelled):
// it names those that were not within 4 minutes ("" when all were).
func (r *round) waitDone(ctx context.Context, plans []*runPlan) (string, error) {
	deadline := time.Now().Add(4 * time.Minute)
	for {
		if err := r.m.alive(); err != nil {
			return "", err
		}
		if err := r.api.err(); err != nil {
			return "", err
		}
		pending := r.api.pending(plans)
		if pending == "" {
			// The watches may lag behind, never run ahead: the API server
			// confirms.
			var err error
			if pending, err = listPending(ctx, r.e, plans); err != nil || pending == "" {
				return "", err
			}
		}
		if time.Now().After(deadline) {
			return pending, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restoreAndWait deletes a completed request object (at times), restores
// the database while the faults go on, and waits until the erasures hold
// again; it returns when they did (zero: the bound passed).
func (r *round) restoreAndWait(ctx context.Context, plans []*runPlan) (time.Time, error) {
	rf := r.restore
	if rf.deleteOne {
		if err := rf.deleteCompleted(ctx, r.e, plans); err != nil {
			return time.Time{}, err
		}
	}
	r.api.forgetRestoresSeen()
	if err := rf.restore(ctx, r.e, r.db, plans, r.seq); err != nil {
		return time.Time{}, err
	}
	heldAt, err := rf.waitHeld(ctx, r.e, r.api, r.db, plans)
	r.f.mu.Lock()
	r.f.restores++
	if rf.deleted != nil {
		r.f.requestsDeleted++
	}
	r.f.mu.Unlock()
	return heldAt, err
}

// finish makes the final re-ingestion attempts, reads the end state, stops
// the recorders, checks every run and removes its requests and store (and,
// when the run passed, its Backup and graph: cleanUp).
func (r *round) finish(ctx context.Context, plans []*runPlan, before map[*runPlan]runRecord,
	api *apiRecorder, graphs *graphRecorder, reingestions *reingestLog, rng *rand.Rand) ([]string, error) {
	e := r.e
	// The end state, then the recorders (the API watches have seen
	// everything up to the final reads once they are stopped after them).
	final := map[*runPlan]map[string]*lethev1.ErasureRequest{}
	for _, p := range plans {
		var deleted *lethev1.ErasureRequest
		if r.restore != nil {
			deleted = r.restore.deletedObject(p)
		}
		states, err := requestStates(ctx, e, p, deleted)
		if err != nil {
			return nil, err
		}
		final[p] = states
	}
	keys, err := publishedKeySet(ctx, e)
	if err != nil {
		return nil, err
	}
	// The log after the final states: each checkpoint they hold was signed
	// over a log read before it was written to its request.
	var logs map[*runPlan]*receiptLogObs
	if err := r.db.do(ctx, func(conn *pgx.Conn) error {
		var err error
		logs, err = storeLogs(ctx, e, conn, plans)
		return err
	}); err != nil {
		return nil, err
	}
	if err := reingestFinal(r.db, plans, final, reingestions, r.f, rng); err != nil {
		return nil, err
	}
	time.Sleep(300 * time.Millisecond)
	api.stop()
	if err := api.err(); err != nil {
		return nil, err
	}
	n, busy := api.deletions()
	r.phases.deletions += n
	r.phases.deleting += busy
	writes := graphs.stop()
	var effects, after []dbEffect
	err = r.db.do(ctx, func(conn *pgx.Conn) error {
		var err error
		if r.restore == nil {
			effects, err = effectsSince(ctx, conn, r.seq)
			return err
		}
		effects = r.restore.effects
		after, err = effectsAfter(ctx, conn, r.restore.at)
		return err
	})
	if err != nil {
		return nil, err
	}
	var violations []string
	for _, p := range plans {
		rec := before[p]
		rec.Effects, rec.Statuses, rec.Backups, rec.DBRs, rec.GraphWrites = effects, api.requests, api.backups, api.dbrs, writes
		rec.Final, rec.Reingestions, rec.KeySet = final[p], reingestions.of(p.ID), keys
		if rec.ReceiptLog, err = observeReceiptLog(ctx, e, p, logs[p], final[p]); err != nil {
			return nil, err
		}
		if r.restore != nil {
			rec.Restore = r.restore.record(p, after)
			if r.restore.detected[p] {
				r.f.mu.Lock()
				r.f.restoresDetected++
				r.f.mu.Unlock()
			}
		}
		var err error
		if rec.GraphAfter, err = testenv.GraphElements(ctx, r.gc.Graph(p.GraphKey)); err != nil {
			return nil, err
		}
		ids := append(slices.Clone(p.Own), p.Foreign)
		if err := r.db.do(ctx, func(conn *pgx.Conn) error {
			if rec.RowsAfter, err = rowsPerSession(ctx, conn, ids); err != nil {
				return err
			}
			if rec.CacheAfter, err = cachePerSession(ctx, conn, ids); err != nil {
				return err
			}
			rec.TombstonedAfter, rec.InForceAfter, err = leftInForce(ctx, conn, p)
			return err
		}); err != nil {
			return nil, err
		}
		found := check(rec)
		for i, v := range found {
			for _, s := range ids {
				if strings.Contains(v, "session "+s+":") && strings.Contains(v, "content-keyed cache entries") {
					_ = r.db.do(ctx, func(conn *pgx.Conn) error { found[i] += explainCache(ctx, conn, p, s); return nil })
				}
			}
		}
		violations = append(violations, found...)
		// Completed requests would be re-verified every minute from now
		// on; the run is over, so they go (the manager removes the finalizer).
		for _, pr := range p.Requests {
			_ = client.IgnoreNotFound(e.k8s.Delete(ctx, rec.Final[pr.Name]))
		}
		_ = e.k8s.Delete(ctx, &lethev1.MemoryStore{ObjectMeta: metaOf(p.NS, "memory")})
		// A run with a violation keeps its Backup and graph to look at.
		if len(found) == 0 {
			if err := cleanUp(ctx, e, p); err != nil {
				r.t.Errorf("run %d: clean up: %v", p.ID, err)
			}
		}
	}
	return violations, nil
}

// requestDone reports a phase a run's request ends in: BackupsRotated or
// Cancelled (the round waits for every request to reach one).
func requestDone(p lethev1.Phase) bool {
	return p == lethev1.PhaseBackupsRotated || p == lethev1.PhaseCancelled
}

// listPending names the requests the API server holds not yet done ("" when
// all are), by one list of each run's namespace.
func listPending(ctx context.Context, e *env, plans []*runPlan) (string, error) {
	var pending []string
	for _, p := range plans {
		list := &lethev1.ErasureRequestList{}
		if err := e.k8s.List(ctx, list, client.InNamespace(p.NS)); err != nil {
			return "", err
		}
		for _, er := range list.Items {
			if !requestDone(er.Status.Phase) {
				pending = append(pending, fmt.Sprintf("%s/%s at %q", er.Namespace, er.Name, er.Status.Phase))
			}
		}
	}
	return strings.Join(pending, ", "), nil
}

// injectFaults kills the manager, drops its database connections, or
// restarts FalkorDB, one at a time at random intervals, until ctx ends.
func injectFaults(ctx context.Context, t testing.TB, e *env, db *database, m *managerHolder, graphs *graphRecorder, f *faults, rng *rand.Rand) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(200+rng.IntN(1800)) * time.Millisecond):
		}
		switch x := rng.Float64(); {
		case x < 0.6:
			if err := m.kill(time.Duration(rng.IntN(300)) * time.Millisecond); err != nil {
				t.Errorf("restart the manager: %v", err)
				return
			}
			f.mu.Lock()
			f.kills++
			f.mu.Unlock()
		case x < 0.85:
			// The superuser connection is the test's own, not the manager's.
			// Not under ctx: pgx closes a connection whose query's context
			// is cancelled, and the round needs it afterwards.
			err := db.within(10*time.Second, func(qctx context.Context, conn *pgx.Conn) error {
				_, err := conn.Exec(qctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'lethe_manager'`)
				return err
			})
			if err != nil {
				t.Errorf("drop the manager's connections: %v", err)
				return
			}
			f.mu.Lock()
			f.dbDrops++
			f.mu.Unlock()
		default:
			seen := graphs.connected.Load()
			if err := e.fdb.SaveAndStop(); err != nil {
				t.Errorf("stop FalkorDB: %v", err)
				return
			}
			time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
			if err := restartFalkorDB(t, e.fdb, f); err != nil {
				t.Errorf("restart FalkorDB: %v", err)
				return
			}
			graphs.waitConnected(seen + 1)
			f.mu.Lock()
			f.graphRest++
			f.mu.Unlock()
		}
	}
}

// restartFalkorDB starts the stopped FalkorDB again. A start that does not
// answer within its bound is killed and started again, as a supervisor
// would, up to three times: valkey-server once stopped answering for more
// than 10 s after it had decoded its save (run 704 of a 1,000-run pass),
// and the pass then ran without a graph. Each such start is logged and
// counted, not hidden.
func restartFalkorDB(t testing.TB, fdb *testenv.FalkorDB, f *faults) error {
	var err error
	for range 3 {
		if err = fdb.Restart(); err == nil {
			return nil
		}
		t.Logf("FalkorDB did not come back; starting it again: %v", err)
		f.mu.Lock()
		f.graphHungStarts++
		f.mu.Unlock()
	}
	return err
}

// publishedKeySet reads the key set the manager publishes beside its key.
func publishedKeySet(ctx context.Context, e *env) (evidence.KeySet, error) {
	cm := &corev1.ConfigMap{}
	if err := e.k8s.Get(ctx, types.NamespacedName{Namespace: receiptKeyNS, Name: receiptKeyName}, cm); err != nil {
		return evidence.KeySet{}, fmt.Errorf("read the published key set: %w", err)
	}
	return evidence.ParseKeySet([]byte(cm.Data["keyset.json"])) // controllers.ReceiptKeySet
}
