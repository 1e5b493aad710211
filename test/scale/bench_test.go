// Package scale holds the scale benchmarks of targets.md: P3 (1,000
// immediate requests applied at once) and P4 (the manager's memory with
// 10,000 requests in its cache), each with its own control plane, Postgres
// and manager, so that the client QPS/burst and the concurrency are the
// benchmark's to set and report.
package scale

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
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
}

func start(b *testing.B) *env {
	b.Helper()
	crds, err := testenv.LetheCRDDir()
	if err != nil {
		b.Fatal(err)
	}
	e := &env{}
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
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		b.Fatal(err)
	}
	pools := &postgres.Pools{Options: postgres.Options{Vector: true, MaxConns: int32(concurrency + 2)}}
	if err := (&controllers.MemoryStoreReconciler{Client: mgr.GetClient(), SecretReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder("lethe-memorystore"), Pools: pools, Graphs: &graph.Clients{}, Velero: noVelero{},
	}).SetupWithManager(mgr); err != nil {
		b.Fatal(err)
	}
	if err := (&controllers.ErasureRequestReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), SecretReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder("lethe-erasurerequest"), Pools: pools, Graphs: &graph.Clients{}, Velero: noVelero{},
		MaxConcurrentReconciles: concurrency,
	}).SetupWithManager(mgr); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
		pools.Close()
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

// waitAll polls until n requests of ns are in phase.
func (e *env) waitAll(b *testing.B, ns string, n int, phase lethev1.Phase, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		list := &lethev1.ErasureRequestList{}
		if err := e.setup.List(context.Background(), list, client.InNamespace(ns)); err != nil {
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

// P3: 1,000 immediate requests (1–5 sessions each, 3,000 sessions with
// facts) applied at once; time until all reach BackupsRotated, per setting.
func BenchmarkP3ThousandRequests(b *testing.B) {
	n := intFlag("LETHE_P3_REQUESTS", 1000)
	e := start(b)
	sizes := []int{1, 2, 3, 4, 5}
	for _, s := range []struct {
		qps         float32
		burst, conc int
	}{{20, 30, 1}, {100, 200, 4}} {
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
		b.ReportMetric(took.Seconds(), name+"-s")
		b.Logf("P3 (%d immediate requests, 1-5 sessions each, %d sessions with 3 facts; client QPS %.0f burst %d, %d concurrent reconciles): all BackupsRotated in %.1f s (target ≤ 120 s); %.1f requests/s; %.1f manager API calls per request",
			n, n*3, s.qps, s.burst, s.conc, took.Seconds(), float64(n)/took.Seconds(), float64(reqs)/float64(n))
	}
}

// P4: the manager's memory with 10,000 requests (10 session IDs each) in
// its cache (dry runs, so each is planned once and left).
func BenchmarkP4TenThousandInCache(b *testing.B) {
	n := intFlag("LETHE_P4_REQUESTS", 10000)
	e := start(b)
	ns, ids := e.store(b, 100)
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	baseRSS := rss()
	stop := e.manager(b, 100, 200, 4)
	defer stop()
	e.waitStoreReady(b, ns)
	e.createAll(b, ns, ids, n, []int{10}, true)
	e.waitAll(b, ns, n, lethev1.PhasePlanned, 20*time.Minute)
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	heap := float64(m.HeapAlloc-base.HeapAlloc) / (1 << 20)
	grown := float64(rss()-baseRSS) / (1 << 20)
	b.ReportMetric(heap, "heap-MiB")
	b.ReportMetric(float64(rss())/(1<<20), "rss-MiB")
	b.Logf("P4 (%d planned requests of 10 session IDs in the cache): live heap %.0f MiB above the process's baseline, resident set %.0f MiB in all (%.0f MiB grown; the benchmark process also holds its own client and the test's objects) (target ≤ 200 MiB resident)",
		n, heap, float64(rss())/(1<<20), grown)
}

// rss is the process's resident set size in bytes.
func rss() uint64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}
