package history

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
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
}

// TestRandomizedFaultHistories runs LETHE_HISTORY_RUNS scenarios (default 6:
// the short mode of `make test`; `make history` runs 1,000), in rounds of
// LETHE_HISTORY_PER_ROUND concurrent runs (default 3). Each round injects
// faults at random moments until its requests are all done; then every run's
// recorded history is checked. LETHE_HISTORY_SEED replays a seed.
func TestRandomizedFaultHistories(t *testing.T) {
	e := shared
	total := envInt("LETHE_HISTORY_RUNS", 6)
	perRound := envInt("LETHE_HISTORY_PER_ROUND", 3)
	seed := uint64(envInt("LETHE_HISTORY_SEED", int(time.Now().UnixNano()%1e9)))
	t.Logf("seed %d (replay with LETHE_HISTORY_SEED=%d)", seed, seed)
	ctx := context.Background()

	conn, err := connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	gc, err := graph.Open(e.fdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gc.Close() }()

	mgr, err := e.startManager()
	if err != nil {
		t.Fatal(err)
	}
	m := &managerHolder{e: e, p: mgr}
	defer m.stop()

	f := &faults{}
	var violations []string
	runs := 0
	started := time.Now()
	for round := 0; runs < total; round++ {
		n := min(perRound, total-runs)
		v, err := runRound(ctx, t, e, conn, gc, m, f, seed+uint64(round), runs, n)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		violations = append(violations, v...)
		runs += n
		if round%10 == 9 {
			t.Logf("%d runs, %s: %d kills, %d connection drops, %d FalkorDB restarts so far", runs, time.Since(started).Round(time.Second), f.kills, f.dbDrops, f.graphRest)
		}
		if len(violations) > 0 {
			break
		}
	}
	t.Logf("%d runs in %s: %d manager kills (SIGKILL), %d database connection drops, %d FalkorDB restarts; %d violations",
		runs, time.Since(started).Round(time.Second), f.kills, f.dbDrops, f.graphRest, len(violations))
	for _, v := range violations {
		t.Error(v)
	}
	if f.kills == 0 {
		t.Error("no manager was killed: the faults did not run")
	}
}

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

// runRound sets up n runs, starts the recorders, applies the requests,
// injects faults until every request is done, and checks each run.
func runRound(ctx context.Context, t *testing.T, e *env, conn *pgx.Conn, gc *graph.Client, m *managerHolder, f *faults, seed uint64, first, n int) ([]string, error) {
	plans := make([]*runPlan, n)
	before := map[*runPlan]runRecord{}
	for i := range plans {
		p := newPlan(first+i, seed)
		plans[i] = p
		if err := seedRun(ctx, e, conn, gc.Graph(p.GraphKey), p); err != nil {
			return nil, fmt.Errorf("seed run %d: %w", p.ID, err)
		}
		rec := runRecord{Plan: p}
		var err error
		if rec.GraphBefore, err = testenv.GraphElements(ctx, gc.Graph(p.GraphKey)); err != nil {
			return nil, err
		}
		if rec.RowsBefore, err = rowsPerSession(ctx, conn, append(slices.Clone(p.Own), p.Foreign)); err != nil {
			return nil, err
		}
		before[p] = rec
	}
	seq, err := lastEffect(ctx, conn)
	if err != nil {
		return nil, err
	}
	api, err := startAPIRecorder(ctx, e.k8s)
	if err != nil {
		return nil, err
	}
	graphs := startGraphRecorder(ctx, e.fdb.Addr())

	roundCtx, stopRound := context.WithCancel(ctx)
	defer stopRound()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	wg.Add(1)
	go func() { defer wg.Done(); playVelero(roundCtx, e) }()
	start := time.Now()
	for _, p := range plans {
		if err := createRequests(ctx, e, p); err != nil {
			return nil, err
		}
		for _, r := range p.Requests {
			if r.CancelAfter > 0 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := cancelLater(roundCtx, e, p, r, start); err != nil && !errors.Is(err, context.Canceled) {
						errs <- err
					}
				}()
			}
		}
	}
	injected := make(chan struct{})
	go func() {
		defer close(injected)
		injectFaults(roundCtx, t, e, conn, m, graphs, f, rand.New(rand.NewPCG(seed, uint64(first))))
	}()

	// Every request must end: BackupsRotated or Cancelled.
	deadline := time.Now().Add(4 * time.Minute)
	for {
		if err := m.alive(); err != nil {
			return nil, err
		}
		pending := pendingRequests(ctx, e, plans)
		if pending == "" {
			break
		}
		if time.Now().After(deadline) {
			stopRound()
			<-injected
			return []string{fmt.Sprintf("round of runs %d-%d: requests did not complete within 4 minutes: %s", first, first+n-1, pending)}, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopRound()
	<-injected
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}

	// The end state, then the recorders (the API watches have seen
	// everything up to the final reads once they are stopped after them).
	final := map[*runPlan]map[string]*lethev1.ErasureRequest{}
	for _, p := range plans {
		final[p] = map[string]*lethev1.ErasureRequest{}
		for _, r := range p.Requests {
			er := &lethev1.ErasureRequest{}
			if err := e.k8s.Get(ctx, keyOf(p.NS, r.Name), er); err != nil {
				return nil, err
			}
			final[p][r.Name] = er
		}
	}
	time.Sleep(300 * time.Millisecond)
	api.stop()
	writes := graphs.stop()
	effects, err := effectsSince(ctx, conn, seq)
	if err != nil {
		return nil, err
	}
	var violations []string
	for _, p := range plans {
		rec := before[p]
		rec.Effects, rec.Statuses, rec.Backups, rec.DBRs, rec.GraphWrites = effects, api.requests, api.backups, api.dbrs, writes
		rec.Final = final[p]
		if rec.GraphAfter, err = testenv.GraphElements(ctx, gc.Graph(p.GraphKey)); err != nil {
			return nil, err
		}
		if rec.RowsAfter, err = rowsPerSession(ctx, conn, append(slices.Clone(p.Own), p.Foreign)); err != nil {
			return nil, err
		}
		violations = append(violations, check(rec)...)
		// Completed requests would be re-verified every minute from now
		// on; the run is over, so they go (the manager removes the finalizer).
		for _, r := range p.Requests {
			_ = e.k8s.Delete(ctx, rec.Final[r.Name])
		}
		_ = e.k8s.Delete(ctx, &lethev1.MemoryStore{ObjectMeta: metaOf(p.NS, "memory")})
	}
	return violations, nil
}

// pendingRequests names the requests not yet done ("" when all are).
func pendingRequests(ctx context.Context, e *env, plans []*runPlan) string {
	var pending []string
	for _, p := range plans {
		list := &lethev1.ErasureRequestList{}
		if err := e.k8s.List(ctx, list, client.InNamespace(p.NS)); err != nil {
			return err.Error()
		}
		for _, er := range list.Items {
			if er.Status.Phase != lethev1.PhaseBackupsRotated && er.Status.Phase != lethev1.PhaseCancelled {
				pending = append(pending, fmt.Sprintf("%s/%s at %q", er.Namespace, er.Name, er.Status.Phase))
			}
		}
	}
	return strings.Join(pending, ", ")
}

// injectFaults kills the manager, drops its database connections, or
// restarts FalkorDB, one at a time at random intervals, until ctx ends.
func injectFaults(ctx context.Context, t *testing.T, e *env, conn *pgx.Conn, m *managerHolder, graphs *graphRecorder, f *faults, rng *rand.Rand) {
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
			qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := conn.Exec(qctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'lethe_manager'`)
			cancel()
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
			if err := e.fdb.Restart(); err != nil {
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

// playVelero does what Velero's server would: it deletes a Backup named by
// a DeleteBackupRequest, and a Backup whose expiration has passed.
func playVelero(ctx context.Context, e *env) {
	for ctx.Err() == nil {
		dbrs := &velerov1.DeleteBackupRequestList{}
		if err := e.k8s.List(ctx, dbrs, client.InNamespace(veleroNS)); err == nil {
			for i := range dbrs.Items {
				d := &dbrs.Items[i]
				_ = client.IgnoreNotFound(e.k8s.Delete(ctx, &velerov1.Backup{ObjectMeta: metaOf(veleroNS, d.Spec.BackupName)}))
				_ = client.IgnoreNotFound(e.k8s.Delete(ctx, d))
			}
		}
		backups := &velerov1.BackupList{}
		if err := e.k8s.List(ctx, backups, client.InNamespace(veleroNS)); err == nil {
			for i := range backups.Items {
				b := &backups.Items[i]
				if b.Status.Expiration != nil && b.Status.Expiration.Time.Before(time.Now()) {
					if err := e.k8s.Delete(ctx, b); err != nil && !apierrors.IsNotFound(err) {
						continue
					}
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
