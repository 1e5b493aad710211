// Package history is Lethe's crash-safety history checker. Randomized runs
// erase, cancel and wait out grace periods while the manager — the real
// binary, as its own process — is killed with SIGKILL and restarted, its
// database connections are terminated, and FalkorDB is restarted, all at
// random moments, while the runs' transcripts are ingested again; some
// rounds then restore the database from a dump taken before their requests.
// Every effect is recorded as it happens (committed database statements by
// triggers, status writes and Velero objects by watches, graph writes by
// FalkorDB's MONITOR), and the recorded history is then checked against the
// invariants of operator.md.
//
// `go test ./test/history` runs the short mode (LETHE_HISTORY_RUNS, default
// 6); `make history` runs the full mode (1,000 runs).
package history

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// env is what every run shares: one control plane with Lethe's and Velero's
// CRDs, one Postgres database (tenants keep runs apart, as in a
// multi-tenant memory system), one FalkorDB (a graph key per run) and the
// manager binary.
type env struct {
	cp         *testenv.ControlPlane
	pg         *testenv.Postgres
	fdb        *testenv.FalkorDB
	k8s        client.WithWatch
	dsn        string // superuser: seeding and recording
	managerDSN string // the least-privileged role the manager runs as
	bin        string
	kubeconfig string
	dir        string
	// velero is the real Velero server every run's Backups are taken by
	// and removed by.
	velero *testenv.Velero
}

var shared *env

const (
	veleroNS = "velero"
	// decoyBackup is another application's Backup, taken once: no store
	// selects it, nothing may touch it.
	decoyBackup    = "history-decoy-nightly"
	receiptKeyNS   = "lethe-system"
	receiptKeyName = "lethe-receipt-key"
)

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: cannot set up the history checker's environment:", err)
		code = 1
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	ctx := context.Background()
	e := &env{}
	var err error
	if e.dir, err = os.MkdirTemp("", "lethe-history-"); err != nil {
		return 1, err
	}
	defer func() { _ = os.RemoveAll(e.dir) }()
	if e.bin, err = testenv.BuildManager(e.dir); err != nil {
		return 1, err
	}
	if e.pg, err = testenv.StartPostgres(); err != nil {
		return 1, err
	}
	defer e.pg.Stop()
	if e.fdb, err = testenv.StartFalkorDB(); err != nil {
		return 1, err
	}
	defer e.fdb.Stop()
	lethe, err := testenv.LetheCRDDir()
	if err != nil {
		return 1, err
	}
	if e.cp, err = testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{CRDDirs: []string{lethe}, Velero: true}); err != nil {
		return 1, err
	}
	defer func() { _ = e.cp.Stop() }()
	if e.kubeconfig, err = e.cp.WriteKubeconfig(e.dir); err != nil {
		return 1, err
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = lethev1.AddToScheme(scheme)
	_ = velerov1.AddToScheme(scheme)
	cfg := *e.cp.Config
	cfg.QPS, cfg.Burst = 500, 1000
	if e.k8s, err = client.NewWithWatch(&cfg, client.Options{Scheme: scheme}); err != nil {
		return 1, err
	}
	if e.dsn, err = e.pg.MigratedDatabase(ctx); err != nil {
		return 1, err
	}
	if e.managerDSN, err = testenv.ManagerDSN(ctx, e.dsn, true); err != nil {
		return 1, err
	}
	if err := installRecorder(ctx, e.dsn); err != nil {
		return 1, err
	}
	if err := e.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: receiptKeyNS}}); err != nil {
		return 1, err
	}
	// A round's Backups are taken at once, as many as a round has runs.
	concurrent := envInt("LETHE_HISTORY_PER_ROUND", 10)
	if e.velero, err = testenv.StartVelero(e.cp.Config, testenv.VeleroOptions{Namespace: veleroNS, ConcurrentBackups: concurrent}); err != nil {
		return 1, err
	}
	defer e.velero.Stop()
	if err := takeDecoyBackup(ctx, e); err != nil {
		return 1, err
	}
	key, err := evidence.GeneratePrivateKeyPEM()
	if err != nil {
		return 1, err
	}
	if err := e.k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: receiptKeyNS, Name: receiptKeyName},
		Data: map[string][]byte{controllers.ReceiptPrivateKey: key}}); err != nil {
		return 1, err
	}
	shared = e
	code := m.Run()
	if code != 0 || os.Getenv("LETHE_HISTORY_KEEP_LOG") != "" {
		fmt.Fprintf(os.Stderr, "manager log: %s (kept)\n", e.keepLog())
	}
	return code, nil
}

// takeDecoyBackup has Velero back up another application's namespace.
func takeDecoyBackup(ctx context.Context, e *env) error {
	const ns = "history-decoy"
	if err := e.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	if err := e.k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other-app", Namespace: ns}, Data: map[string]string{"k": "v"}}); err != nil {
		return err
	}
	if _, err := e.velero.TakeBackup(ctx, decoyBackup, testenv.BackupOptions{Labels: map[string]string{"app": ns}, Namespaces: []string{ns}, TTL: 90 * 24 * time.Hour}); err != nil {
		return err
	}
	_, err := e.velero.WaitBackup(ctx, decoyBackup)
	return err
}

// keepLog copies the manager's log out of the temp folder for a failed
// run, or any run with LETHE_HISTORY_KEEP_LOG set (to count what it logged).
func (e *env) keepLog() string {
	raw, err := os.ReadFile(e.logPath())
	if err != nil {
		return "unavailable: " + err.Error()
	}
	out := filepath.Join(os.TempDir(), fmt.Sprintf("lethe-history-manager-%d.log", os.Getpid()))
	if err := os.WriteFile(out, raw, 0o600); err != nil {
		return "unavailable: " + err.Error()
	}
	return out
}

func (e *env) logPath() string { return filepath.Join(e.dir, "manager.log") }

// storeRecheck is the stores' audit interval the manager runs with.
const storeRecheck = 10 * time.Second

// startManager runs the manager binary with settings that make every step
// take several transactions and batches, so that faults land inside them.
func (e *env) startManager() (*testenv.ManagerProcess, error) {
	return testenv.StartManager(e.bin, e.kubeconfig, e.logPath(),
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--delete-batch-size=1", "--graph-batch-size=1", "--graph-delete-limit=2",
		"--backup-recheck-interval=1s", "--error-backoff-max=2s", "--store-recheck-interval="+storeRecheck.String(), "--probe-timeout=3s",
		"--max-concurrent-reconciles=4", "--postgres-max-conns=4",
		"--receipt-key-secret="+receiptKeyNS+"/"+receiptKeyName, "--record-key-secret="+receiptKeyNS+"/lethe-erasure-record-key",
		"--min-grace-period=1ms")
}
