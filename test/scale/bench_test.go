// Package scale holds the scale benchmarks of targets.md: P3 (1,000
// immediate requests applied at once) and P4 (the manager's memory with
// 10,000 requests in its cache), each with its own control plane, Postgres
// and manager, so that the client QPS/burst and the concurrency are the
// benchmark's to set and report.
package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/benchreport"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// countingTransport counts the manager's API requests.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

type env struct {
	cp      *testenv.ControlPlane
	pg      *testenv.Postgres
	scheme  *k8sruntime.Scheme
	setup   client.Client
	apiReqs atomic.Int64
	// dsns are the stores' databases, by namespace.
	dsns map[string]string
}

func start(b *testing.B) *env {
	b.Helper()
	crds, err := testenv.LetheCRDDir()
	if err != nil {
		b.Fatal(err)
	}
	// The benchmark's own caches log through controller-runtime: to nowhere,
	// rather than its "SetLogger was never called" stack in the report.
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	e := &env{dsns: map[string]string{}}
	if e.cp, err = testenv.StartControlPlane(crds); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.cp.Stop() })
	if e.pg, err = testenv.StartPostgres(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.pg.Stop)
	e.scheme = k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(e.scheme)
	_ = lethev1.AddToScheme(e.scheme)
	cfg := rest.CopyConfig(e.cp.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	if e.setup, err = client.New(cfg, client.Options{Scheme: e.scheme}); err != nil {
		b.Fatal(err)
	}
	return e
}

// manager starts a manager with the given client QPS/burst and
// concurrency; stop it with the returned func.
func (e *env) manager(b *testing.B, qps float32, burst, concurrency int) func() {
	b.Helper()
	cfg := rest.CopyConfig(e.cp.Config)
	cfg.QPS, cfg.Burst = qps, burst
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, n: &e.apiReqs} }
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     e.scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Client:     client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache:      controllers.CacheOptions(true),
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		b.Fatal(err)
	}
	pools := &postgres.Pools{Options: postgres.Options{Vector: true, MaxConns: int32(concurrency + 2)}}
	conn := &connector.Connector{Secrets: mgr.GetAPIReader(), SecretTTL: 5 * time.Second, Pools: pools, Graphs: &graph.Clients{}}
	if err := (&controllers.MemoryStoreReconciler{Client: mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("lethe-memorystore"), Connector: conn, Velero: noVelero{},
	}).SetupWithManager(mgr); err != nil {
		b.Fatal(err)
	}
	if err := (&controllers.ErasureRequestReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), SecretReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder("lethe-erasurerequest"), Connector: conn,
		MaxConcurrentReconciles: concurrency,
	}).SetupWithManager(mgr); err != nil {
		b.Fatal(err)
	}
	stop := runUntilStopped(b, mgr.Start)
	return func() {
		stop()
		pools.Close()
	}
}

// runUntilStopped runs start (a manager's or a cache's) in the background;
// the returned func cancels it and waits for it to return.
func runUntilStopped(b *testing.B, start func(context.Context) error) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}
}

type noVelero struct{}

func (noVelero) Installed(context.Context) (bool, error) { return false, nil }

// store creates a namespace with a Postgres-only MemoryStore over a fresh
// database holding sessions, and returns the namespace and the session IDs.
func (e *env) store(b *testing.B, sessions int) (string, []string) {
	b.Helper()
	ctx := context.Background()
	dsn, err := e.pg.MigratedDatabase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	ns := fmt.Sprintf("scale-%d", time.Now().UnixNano())
	e.dsns[ns] = dsn
	ids, err := fixture.SeedBulk(ctx, conn, "memory", ns, sessions, 3, 50)
	if err != nil {
		b.Fatal(err)
	}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: ns}, StringData: map[string]string{"dsn": dsn}},
		&lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: ns},
			Spec: lethev1.MemoryStoreSpec{Postgres: lethev1.PostgresSpec{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}}}},
	} {
		if err := e.setup.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	return ns, ids
}

// createAll creates requests concurrently; sizes cycles through the
// sessions per request.
func (e *env) createAll(b *testing.B, ns string, ids []string, n int, sizes []int, dryRun bool) {
	b.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, n)
	next := 0
	for i := 0; i < n; i++ {
		size := sizes[i%len(sizes)]
		chunk := make([]lethev1.SessionID, 0, size)
		for j := 0; j < size; j++ {
			chunk = append(chunk, lethev1.SessionID(ids[(next+j)%len(ids)]))
		}
		next += size
		er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("r-%05d", i), Namespace: ns},
			Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"}, SessionIDs: chunk,
				Immediate: !dryRun, Reason: "scale benchmark", DryRun: dryRun}}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := e.setup.Create(context.Background(), er); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// waitAll waits until n requests of ns are in phase. It counts them in a
// watch-fed cache holding each request's phase only: listing 10,000 whole
// requests from the API server every poll is about 100 MB of JSON encoded
// and decoded on the two cores the manager under measurement runs on.
func (e *env) waitAll(b *testing.B, ns string, n int, phase lethev1.Phase, timeout time.Duration) {
	b.Helper()
	phases, err := cache.New(e.cp.Config, cache.Options{Scheme: e.scheme,
		DefaultNamespaces: map[string]cache.Config{ns: {}}, DefaultTransform: phaseOnly})
	if err != nil {
		b.Fatal(err)
	}
	defer runUntilStopped(b, phases.Start)()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		list := &lethev1.ErasureRequestList{}
		if err := phases.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil && !errors.As(err, new(*cache.ErrCacheNotStarted)) {
			b.Fatal(err)
		}
		done := 0
		for _, er := range list.Items {
			if er.Status.Phase == phase {
				done++
			}
		}
		if done == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d requests at %s after %s", done, n, phase, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// phaseOnly keeps of a request its name and phase, all waitAll reads.
func phaseOnly(o any) (any, error) {
	er, ok := o.(*lethev1.ErasureRequest)
	if !ok {
		return o, nil
	}
	return &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: er.Name, Namespace: er.Namespace, ResourceVersion: er.ResourceVersion},
		Status: lethev1.ErasureRequestStatus{Phase: er.Status.Phase}}, nil
}

// waitStoreReady waits for the store's audit, which the requests' deletion
// waits for: the clock starts once it is done.
func (e *env) waitStoreReady(b *testing.B, ns string) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st := &lethev1.MemoryStore{}
		if err := e.setup.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "memory"}, st); err != nil {
			b.Fatal(err)
		}
		if meta.IsStatusConditionTrue(st.Status.Conditions, lethev1.MemoryStoreReady) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("store not Ready: %+v", st.Status.Conditions)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func intFlag(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// p3Target is P3's target time in seconds for n requests: 10,000 in 10
// minutes, pro rata.
func p3Target(n int) float64 { return float64(n) * 0.06 }

// P3: 1,000 immediate requests (1–5 sessions each, 3,000 sessions with
// facts) applied at once; time until all reach BackupsRotated, per setting.
func BenchmarkP3ThousandRequests(b *testing.B) {
	n := intFlag("LETHE_P3_REQUESTS", 1000)
	e := start(b)
	sizes := []int{1, 2, 3, 4, 5}
	for _, s := range []struct {
		qps         float32
		burst, conc int
	}{{20, 30, 1}, {100, 200, 4}, {200, 400, 8}} {
		ns, ids := e.store(b, n*3)
		stop := e.manager(b, s.qps, s.burst, s.conc)
		e.waitStoreReady(b, ns)
		before := e.apiReqs.Load()
		t0 := time.Now()
		e.createAll(b, ns, ids, n, sizes, false)
		e.waitAll(b, ns, n, lethev1.PhaseBackupsRotated, 20*time.Minute)
		took := time.Since(t0)
		reqs := e.apiReqs.Load() - before
		stop()
		name := fmt.Sprintf("qps%.0f-burst%d-conc%d", s.qps, s.burst, s.conc)
		target := p3Target(n)
		b.ReportMetric(took.Seconds(), name+"-s")
		setting := fmt.Sprintf("%d immediate requests of 1–5 sessions, QPS %.0f, burst %d, %d concurrent reconciles", n, s.qps, s.burst, s.conc)
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "all requests at BackupsRotated", Setting: setting, Unit: "s",
			Runs: []float64{took.Seconds()}, Target: target, HasTarget: true})
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "manager API calls per request", Setting: setting, Unit: "calls",
			Runs: []float64{float64(reqs) / float64(n)}})
		b.Logf("P3 (%d immediate requests, 1-5 sessions each, %d sessions with 3 facts; client QPS %.0f burst %d, %d concurrent reconciles): all BackupsRotated in %.1f s (target ≤ %.0f s); %.1f requests/s; %.1f manager API calls per request",
			n, n*3, s.qps, s.burst, s.conc, took.Seconds(), target, float64(n)/took.Seconds(), float64(reqs)/float64(n))
	}
}

// P3 at scale: the manager binary, as its own process with its default
// flags, takes 1,000 and then 10,000 immediate requests (1–5 sessions
// each) applied at once to BackupsRotated; the time, the reconciles per
// second and API calls per request (from its own metrics) and its largest
// resident set while it works.
func BenchmarkP3TenThousandRequestsManagerProcess(b *testing.B) {
	e := start(b)
	dir, bin, kubeconfig := e.managerBinary(b)
	for _, n := range []int{1000, intFlag("LETHE_P3_LARGE_REQUESTS", 10000)} {
		ns, ids := e.store(b, n*3)
		m := startProcess(b, bin, kubeconfig, dir, true)
		e.waitStoreReady(b, ns)
		before, err := m.scrape(apiCallsMetric, reconcilesMetric)
		if err != nil {
			b.Fatal(err)
		}
		stopSampling, peak := m.sampleUntilStopped(b)
		t0 := time.Now()
		e.createAll(b, ns, ids, n, []int{1, 2, 3, 4, 5}, false)
		e.waitAll(b, ns, n, lethev1.PhaseBackupsRotated, 40*time.Minute)
		took := time.Since(t0)
		after, err := m.scrape(apiCallsMetric, reconcilesMetric)
		if err != nil {
			b.Fatal(err)
		}
		// A completed request's proof is mirrored into the database after
		// the status write that completed it: done is when every proof is.
		e.waitProofs(b, ns, n, 40*time.Minute)
		mirrored := time.Since(t0)
		stopSampling()
		done, err := m.scrape(apiCallsMetric, reconcilesMetric)
		if err != nil {
			b.Fatal(err)
		}
		m.stop()
		calls := (after[apiCallsMetric] - before[apiCallsMetric]) / float64(n)
		reconciles := (after[reconcilesMetric] - before[reconcilesMetric]) / took.Seconds()
		callsDone := (done[apiCallsMetric] - before[apiCallsMetric]) / float64(n)
		passesDone := (done[reconcilesMetric] - before[reconcilesMetric]) / float64(n)
		rss := float64(peak()) / (1 << 20)
		setting := fmt.Sprintf("%d immediate requests of 1–5 sessions; manager binary, %s (defaults: QPS 100, burst 200, 4 concurrent reconciles)", n, flagsSetting())
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "all requests at BackupsRotated", Setting: setting, Unit: "s",
			Runs: []float64{took.Seconds()}, Target: p3Target(n), HasTarget: true})
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "manager API calls per request", Setting: setting, Unit: "calls", Runs: []float64{calls}})
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "ErasureRequest reconciles per second", Setting: setting, Unit: "/s", Runs: []float64{reconciles}})
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "all requests done, every proof mirrored", Setting: setting, Unit: "s",
			Runs: []float64{mirrored.Seconds()}, Target: p3Target(n), HasTarget: true})
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "API calls per request, until every proof is mirrored", Setting: setting, Unit: "calls", Runs: []float64{callsDone}})
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "passes per request, until every proof is mirrored", Setting: setting, Unit: "passes", Runs: []float64{passesDone}})
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "manager resident memory, most while working", Setting: setting, Unit: "MiB",
			Runs: []float64{rss}, Target: 200, HasTarget: true})
		b.Logf("P3 process (%d immediate requests, 1-5 sessions each; %s): all BackupsRotated in %.1f s; %.1f reconciles/s; %.1f API calls per request; every proof mirrored at %.1f s, %.1f API calls and %.1f passes per request by then; resident set at most %.0f MiB",
			n, flagsSetting(), took.Seconds(), reconciles, calls, mirrored.Seconds(), callsDone, passesDone, rss)
	}
}

// waitProofs waits until the store of ns holds the mirrored proof of n requests.
func (e *env) waitProofs(b *testing.B, ns string, n int, timeout time.Duration) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.dsns[ns])
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	deadline := time.Now().Add(timeout)
	for {
		var got int
		if err := conn.QueryRow(ctx, `SELECT count(DISTINCT request_uid) FROM lethe.erasure_proofs`).Scan(&got); err != nil {
			b.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d proofs mirrored after %s", got, n, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// The manager's own metrics: client-go's API requests and the
// ErasureRequest controller's reconciles.
const (
	apiCallsMetric   = "rest_client_requests_total"
	reconcilesMetric = `controller_runtime_reconcile_total{controller="erasurerequest"`
)

// sampleUntilStopped reads the manager's resident set every half second
// until stop is called; peak returns the largest read.
func (m *managerProc) sampleUntilStopped(b *testing.B) (stop func(), peak func() int64) {
	b.Helper()
	var most atomic.Int64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			if r, err := m.p.RSS(); err == nil && int64(r) > most.Load() {
				most.Store(int64(r))
			}
			select {
			case <-done:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); <-finished }, func() int64 {
		if most.Load() == 0 {
			b.Fatal("the manager's resident set was never read")
		}
		return most.Load()
	}
}

// P4: the resident memory of the manager — the real binary, as its own
// process — with 10,000 requests (10 session IDs each) in its cache. The
// requests are planned as dry runs by a first manager; then a manager
// without and one with the managed-fields cache transform each start over
// the same 10,000, reconcile them all, and are sampled for 10 s once their
// queue is empty: the before/after of the transform in the same run.
func BenchmarkP4TenThousandInCache(b *testing.B) {
	n := intFlag("LETHE_P4_REQUESTS", 10000)
	e := start(b)
	dir, bin, kubeconfig := e.managerBinary(b)
	ns, ids := e.store(b, 100)
	planner := startProcess(b, bin, kubeconfig, dir, true)
	e.waitStoreReady(b, ns)
	e.createAll(b, ns, ids, n, []int{10}, true)
	e.waitAll(b, ns, n, lethev1.PhasePlanned, 30*time.Minute)
	planner.stop()

	for _, strip := range []bool{false, true} {
		m := startProcess(b, bin, kubeconfig, dir, strip)
		m.waitReconciled(b, n, 10*time.Minute)
		rss, heap := m.sample(b, 10*time.Second)
		m.stop()
		name := "strip-managed-fields"
		if !strip {
			name = "keep-managed-fields"
		}
		b.ReportMetric(rss/(1<<20), name+"-rss-MiB")
		benchreport.Record(b, benchreport.Row{ID: "P4", Figure: "manager resident memory, most over 10 s",
			Setting: fmt.Sprintf("%d requests cached, --cache-strip-managed-fields=%v", n, strip), Unit: "MiB",
			Runs: []float64{rss / (1 << 20)}, Target: 200, HasTarget: true})
		b.Logf("P4 (%d planned requests of 10 session IDs in the cache, manager binary with its default flags: client QPS 100 burst 200, 4 concurrent reconciles, GOGC default; --cache-strip-managed-fields=%v): resident set %.0f MiB at most over 10 s, Go heap in use %.0f MiB (target ≤ 200 MiB resident)",
			n, strip, rss/(1<<20), heap/(1<<20))
	}
}

// managerBinary builds the manager into a temporary folder and writes a
// kubeconfig of the control plane there; it returns the folder, the
// binary and the kubeconfig.
func (e *env) managerBinary(b *testing.B) (dir, bin, kubeconfig string) {
	b.Helper()
	dir = b.TempDir()
	bin, err := testenv.BuildManager(dir)
	if err != nil {
		b.Fatal(err)
	}
	if kubeconfig, err = e.cp.WriteKubeconfig(dir); err != nil {
		b.Fatal(err)
	}
	return dir, bin, kubeconfig
}

// managerProc is a manager binary under measurement, with its metrics endpoint.
type managerProc struct {
	p       *testenv.ManagerProcess
	metrics string
}

// startProcess starts the manager binary; LETHE_BENCH_PPROF (an address
// such as 127.0.0.1:6061) serves its Go profiles there while it runs.
func startProcess(b *testing.B, bin, kubeconfig, dir string, strip bool) *managerProc {
	b.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	args := append([]string{fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", port), "--health-probe-bind-address=0",
		fmt.Sprintf("--cache-strip-managed-fields=%v", strip), "--pprof-bind-address=" + os.Getenv("LETHE_BENCH_PPROF")},
		extraManagerArgs()...)
	p, err := testenv.StartManager(bin, kubeconfig, filepath.Join(dir, "manager.log"), args...)
	if err != nil {
		b.Fatal(err)
	}
	m := &managerProc{p: p, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port)}
	b.Cleanup(m.stop)
	return m
}

// extraManagerArgs are flags LETHE_BENCH_MANAGER_ARGS adds to the manager
// process (space-separated), to measure a setting other than the defaults.
func extraManagerArgs() []string { return strings.Fields(os.Getenv("LETHE_BENCH_MANAGER_ARGS")) }

// flagsSetting says which flags the manager process ran with.
func flagsSetting() string {
	if extra := extraManagerArgs(); len(extra) > 0 {
		return "default flags but " + strings.Join(extra, " ")
	}
	return "default flags"
}

func (m *managerProc) stop() { m.p.Stop(10 * time.Second) }

// scrape reads the manager's metrics: the sum of each named series.
func (m *managerProc) scrape(names ...string) (map[string]float64, error) {
	resp, err := http.Get(m.metrics)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		for _, name := range names {
			rest, ok := strings.CutPrefix(line, name)
			// A name may carry the start of its labels: then any series it begins counts.
			if !ok || (!strings.Contains(name, "{") && rest != "" && rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			f := strings.Fields(line)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				out[name] += v
			}
		}
	}
	return out, nil
}

// waitReconciled waits until the ErasureRequest controller has reconciled
// n requests since start and its queue is empty.
func (m *managerProc) waitReconciled(b *testing.B, n int, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if done, err := m.p.Exited(); done {
			b.Fatalf("manager exited: %v", err)
		}
		got, err := m.scrape(`controller_runtime_reconcile_total{controller="erasurerequest"`, `workqueue_depth{controller="erasurerequest"`)
		if err == nil && got[`controller_runtime_reconcile_total{controller="erasurerequest"`] >= float64(n) && got[`workqueue_depth{controller="erasurerequest"`] == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("manager did not reconcile %d requests within %s: %v %v", n, timeout, got, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// sample reads the resident set (from /proc) and the Go heap in use (from
// the metrics) every half second for d, and returns the largest of each.
func (m *managerProc) sample(b *testing.B, d time.Duration) (rss, heap float64) {
	b.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		r, err := m.p.RSS()
		if err != nil {
			b.Fatal(err)
		}
		rss = max(rss, float64(r))
		if got, err := m.scrape("go_memstats_heap_inuse_bytes"); err == nil {
			heap = max(heap, got["go_memstats_heap_inuse_bytes"])
		}
	}
	return rss, heap
}
