package controllers_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	pgxvec "github.com/pgvector/pgvector-go/pgx"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/backups"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/storerecord"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// The suite runs the real thing: kube-apiserver + etcd, PostgreSQL with
// pgvector, FalkorDB, and the manager with its controllers.
var (
	k8s   client.Client
	cp    *testenv.ControlPlane
	pg    *testenv.Postgres
	fdb   *testenv.FalkorDB
	pools = &postgres.Pools{Options: postgres.Options{Vector: true}}

	managerLogs testenv.SyncBuffer
	// operatorClock runs 8 days ahead of the database (target R6): grace
	// periods must still last their full length by the database's clock.
	operatorClock = clocktesting.NewFakeClock(time.Now().Add(8 * 24 * time.Hour))
)

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: cannot set up the controller test environment:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	// Every log line of the manager is kept, so that tests can grep them for personal data (S4).
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(io.MultiWriter(&managerLogs, levelFilter{os.Stderr})), zap.Level(zapcore.DebugLevel)))
	var err error
	if pg, err = testenv.StartPostgres(); err != nil {
		return 1, err
	}
	defer pg.Stop()
	if fdb, err = testenv.StartFalkorDB(); err != nil {
		return 1, err
	}
	defer fdb.Stop()
	crds, err := testenv.LetheCRDDir()
	if err != nil {
		return 1, err
	}
	// Velero's CRDs are there from the start, whatever order the tests run in;
	// the test that needs them absent first starts a control plane of its own.
	if cp, err = testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{CRDDirs: []string{crds}, Velero: true}); err != nil {
		return 1, err
	}
	defer func() { _ = cp.Stop() }()
	if k8s, err = client.New(cp.Config, client.Options{Scheme: suiteScheme()}); err != nil {
		return 1, err
	}
	// Receipts are signed with a key from a Secret, as an operator would configure it.
	if err := createReceiptKey(context.Background()); err != nil {
		return 1, err
	}
	stop, err := startManager(cp.Config, pools, false)
	if err != nil {
		return 1, err
	}
	defer pools.Close()
	code := m.Run()
	if err := stop(); err != nil {
		return code, fmt.Errorf("manager: %w", err)
	}
	return code, nil
}

func suiteScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = lethev1.AddToScheme(scheme)
	_ = velerov1.AddToScheme(scheme)
	return scheme
}

// startManager starts a manager with both controllers, configured as the
// suite's, against the API server of cfg; stop ends it and waits.
// another is set for a manager beside the suite's in the same process.
func startManager(cfg *rest.Config, pools *postgres.Pools, another bool, opts ...func(*controllers.ErasureRequestReconciler)) (stop func() error, err error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     suiteScheme(),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Client:     client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache:      controllers.CacheOptions(true),
		Controller: config.Controller{SkipNameValidation: ptr.To(another)},
	})
	if err != nil {
		return nil, err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	graphs := &graph.Clients{}
	detector := backups.Detector{Discovery: disc}
	reverify := make(chan event.TypedGenericEvent[client.Object], 1024)
	withheld := &controllers.WithheldInclusions{}
	conn := &connector.Connector{Secrets: mgr.GetAPIReader(), SecretTTL: 5 * time.Second, Pools: pools, Graphs: graphs, Velero: backups.Velero{
		Detector: detector, Rotator: backups.Rotator{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Concurrency: 8}}}
	records := &controllers.ErasureRecords{Connector: conn,
		Keeper: &storerecord.Keeper{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
			KeySecret: types.NamespacedName{Namespace: "default", Name: "lethe-erasure-record-key"}}}
	if err := (&controllers.MemoryStoreReconciler{
		Client:          mgr.GetClient(),
		Records:         records,
		BatchSize:       2,
		ReapMinAge:      time.Second,
		Recorder:        mgr.GetEventRecorder("lethe-memorystore"),
		Connector:       conn,
		Reverify:        reverify,
		Withheld:        withheld,
		Velero:          detector,
		RecheckInterval: storeRecheckForTests,
		NotReadyRetry:   500 * time.Millisecond,
		ProbeTimeout:    3 * time.Second,
		RedactionSample: 200,
		// The tests' graphs are small: a sweep refusing to remove more than
		// half of one is exercised in internal/graph.
		SweepMaxOrphanFraction: 0.9,
		ReceiptKeySet:          receiptKeySecret,
		APIReader:              mgr.GetAPIReader(),
	}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	requests := &controllers.ErasureRequestReconciler{
		Client:           lostStatusWrites.client(mgr.GetClient()),
		APIReader:        mgr.GetAPIReader(),
		SecretReader:     mgr.GetAPIReader(),
		Records:          records,
		Recorder:         mgr.GetEventRecorder("lethe-erasurerequest"),
		Clock:            operatorClock,
		Connector:        crashingConnector{inner: conn, lost: lostStatusWrites},
		Reverify:         reverify,
		Withheld:         withheld,
		BackoffBase:      20 * time.Millisecond,
		BackoffMax:       time.Second,
		BackupRecheck:    time.Second,
		ReceiptKeySecret: receiptKeySecret,
		KeyCacheTTL:      time.Second,
		GraphBatch:       1,
		GraphDeleteLimit: 2,
		GraphTimeout:     3 * time.Second,
		ReverifyInterval: time.Second,
		MinGracePeriod:   time.Millisecond,
		BatchSize:        2,
		ProbeBudget:      16,
		RetryAfter:       300 * time.Millisecond,
		Velero:           detector,
		// Velero's watches start within moments of its CRDs appearing.
		VeleroDiscoveryInterval: 200 * time.Millisecond,
	}
	for _, o := range opts {
		o(requests)
	}
	if err := requests.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() error {
		cancel()
		err := <-done
		graphs.Close()
		return err
	}, nil
}

// levelFilter passes log lines to the test output only when LETHE_TEST_VERBOSE is set.
type levelFilter struct{ w io.Writer }

func (f levelFilter) Write(p []byte) (int, error) {
	if os.Getenv("LETHE_TEST_VERBOSE") != "" {
		return f.w.Write(p)
	}
	return len(p), nil
}

// eventually polls check until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("not reached after %s: %v", timeout, err)
}

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	return newNamespaceIn(t, k8s, prefix)
}

// newNamespaceIn is newNamespace in the API server of c.
func newNamespaceIn(t *testing.T, c client.Client, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeRequestsAndStores(t, c, ns.Name) })
	return ns.Name
}

// removeRequestsAndStores deletes a finished test's requests and stores. Left
// behind, each request is checked again every ReverifyInterval and each
// store audited every AuditInterval for the rest of the suite, by a manager
// that works one request at a time: later tests' passes would wait behind
// them, and those whose database the test stopped would fail every second.
// Their finalizers get a few seconds; what is still there then (a request
// stalled mid-deletion holds its store, and the store holds it) has its
// finalizers removed: the test that made it is over.
func removeRequestsAndStores(t *testing.T, c client.Client, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, obj := range []client.Object{&lethev1.ErasureRequest{}, &lethev1.MemoryStore{}} {
		if err := c.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil {
			t.Logf("clean-up of namespace %s: %v", ns, err)
			return
		}
	}
	// A failed list is not "nothing left": it is logged, and the
	// finalizers of what the last good list held are still removed.
	var held []client.Object
	left := func() []client.Object {
		var out []client.Object
		for _, l := range []client.ObjectList{&lethev1.ErasureRequestList{}, &lethev1.MemoryStoreList{}} {
			if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
				t.Logf("clean-up of namespace %s: list: %v", ns, err)
				return held
			}
			switch l := l.(type) {
			case *lethev1.ErasureRequestList:
				for i := range l.Items {
					out = append(out, &l.Items[i])
				}
			case *lethev1.MemoryStoreList:
				for i := range l.Items {
					out = append(out, &l.Items[i])
				}
			}
		}
		held = out
		return out
	}
	for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait) && len(left()) > 0; {
		time.Sleep(200 * time.Millisecond)
	}
	for _, obj := range left() {
		if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("clean-up of %s/%s: %v", ns, obj.GetName(), err)
		}
	}
}

func createSecret(t *testing.T, ns, name string, data map[string]string) {
	t.Helper()
	createSecretIn(t, k8s, ns, name, data)
}

// createSecretIn is createSecret in the API server of c.
func createSecretIn(t *testing.T, c client.Client, ns, name string, data map[string]string) {
	t.Helper()
	// The manager connects as the least-privileged role of migration 00004
	// (S3), never as the superuser the tests seed with.
	for _, k := range []string{"dsn", "replica"} {
		if v, ok := data[k]; ok {
			data[k] = managerDSN(t, v, k == "dsn")
		}
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: data}
	if err := c.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// migratedDatabase returns the DSN of a new database with every migration applied.
func migratedDatabase(t *testing.T) string {
	t.Helper()
	dsn, err := pg.MigratedDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// ownMemoryDatabase starts a Postgres of the test's own (to stop, restart or
// replicate), with database "memory" migrated and two sessions of tenant t1
// (erasedA, keptB) seeded. The server is stopped when the test ends.
func ownMemoryDatabase(t *testing.T) *testenv.Postgres {
	t.Helper()
	ctx := context.Background()
	own, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Stop)
	if err := own.Exec(ctx, "postgres", "CREATE DATABASE memory"); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Migrate(ctx, own.DSN("memory")); err != nil {
		t.Fatal(err)
	}
	conn := connectVector(t, own.DSN("memory"))
	for i, id := range []string{erasedA, keptB} {
		if err := fixture.Seed(ctx, conn, fixture.Session{ID: id, Tenant: "t1", Rounds: 2, Text: "x", Seed: i}); err != nil {
			t.Fatal(err)
		}
	}
	return own
}

// connectVector opens a connection with pgvector's types, closed when the test ends.
func connectVector(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	if err := pgxvec.RegisterTypes(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return conn
}

// storeRecheckForTests is the suite's MemoryStore audit interval.
const storeRecheckForTests = 2 * time.Second

var receiptKeySecret = types.NamespacedName{Namespace: "lethe-system", Name: "lethe-receipt-key"}

func createReceiptKey(ctx context.Context) error { return createReceiptKeyIn(ctx, k8s) }

// createReceiptKeyIn creates the signing key's namespace and Secret in the
// API server of c (a manager signs every history entry with it).
func createReceiptKeyIn(ctx context.Context, c client.Client) error {
	key, err := evidence.GeneratePrivateKeyPEM()
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: receiptKeySecret.Namespace}}); err != nil {
		return err
	}
	return c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: receiptKeySecret.Namespace, Name: receiptKeySecret.Name},
		Data: map[string][]byte{controllers.ReceiptPrivateKey: key}})
}

// managerDSN turns a superuser DSN of a test cluster into the DSN of the
// login role lethe_manager, a member of lethe_operator, creating the role in
// that cluster when create is set (a replica gets it by replication).
func managerDSN(t *testing.T, dsn string, create bool) string {
	t.Helper()
	out, err := testenv.ManagerDSN(context.Background(), dsn, create)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startNamespacedRequestManager starts a request controller beside the
// suite's manager, built by build with its own pools, watching ns only:
// started with every request earlier tests left (each re-verified on
// start), its queue would be busy for seconds while the suite's manager
// did the test's work alone. stop ends it and closes its pools.
func startNamespacedRequestManager(t *testing.T, ns string, build func(ctrl.Manager, *connector.Connector) *controllers.ErasureRequestReconciler) (stop func()) {
	t.Helper()
	cacheOpts := controllers.CacheOptions(true)
	cacheOpts.DefaultNamespaces = map[string]cache.Config{ns: {}}
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:     suiteScheme(),
		Cache:      cacheOpts,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Client:     client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	pools := &postgres.Pools{Options: postgres.Options{Vector: true}}
	conn := &connector.Connector{Secrets: mgr.GetAPIReader(), Pools: pools, Graphs: &graph.Clients{}}
	if err := build(mgr, conn).SetupWithManager(mgr); err != nil {
		pools.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("second manager: %v", err)
		}
		pools.Close()
	}
}
