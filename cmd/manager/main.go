// Command manager runs the Lethe operator, or applies Lethe's migrations with
// `manager migrate --dsn DSN` (the operator itself never migrates).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/backups"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/storerecord"
	"github.com/lethe-dev/lethe/internal/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		os.Exit(runMigrate(os.Args[2:]))
	}
	os.Exit(runManager(os.Args[1:]))
}

// runMigrate applies the embedded migrations to one database and reports the version.
func runMigrate(args []string) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	dsn := fs.String("dsn", "", "PostgreSQL DSN of the memory database (or set LETHE_PG_DSN, which keeps it out of the process list)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "Usage: manager migrate --dsn DSN\n\nApplies Lethe's migrations (the reference memory schema and the erasure-support objects) and prints the version.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "migrate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *dsn == "" {
		*dsn = os.Getenv("LETHE_PG_DSN")
	}
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "migrate: --dsn (or LETHE_PG_DSN) is required")
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, *timeout)
	defer cancelTimeout()
	res, err := postgres.Migrate(ctx, *dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		return 1
	}
	fmt.Printf("migrated: database at version %d (applied %d migration(s) now: %v)\n", res.Version, len(res.Applied), res.Applied)
	return 0
}

type managerFlags struct {
	metricsAddr, probeAddr string
	pprofAddr              string
	leaderElect            bool
	leaderElectionNS       string
	storeRecheck           time.Duration
	probeTimeout           time.Duration
	redactionSample        int
	pgMaxConns             int
	vacuumGap              time.Duration
	reverify               time.Duration
	minGrace               time.Duration
	planTTL                time.Duration
	batchSize              int
	probeBudget            int
	graphBatch             int
	graphDeleteLimit       int
	sweepMaxOrphanPercent  int
	backupRecheck          time.Duration
	errorBackoffMax        time.Duration
	kubeQPS                float64
	kubeBurst              int
	receiptKey             string
	recordKey              string
	receiptKeyCreate       bool
	concurrency            int
	stripManagedFields     bool
	secretTTL              time.Duration
}

// runManager parses and checks the flags, then runs the operator until it is
// signalled to stop. It returns the process's exit code.
func runManager(args []string) int {
	var f managerFlags
	fs := flag.CommandLine
	bindManagerFlags(fs, &f)
	printVersion := fs.Bool("version", false, "print the build information (version, commit, date) as JSON and exit")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "Usage: manager [flags]\n       manager migrate --dsn DSN\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *printVersion {
		b, _ := json.Marshal(version.Get())
		fmt.Println(string(b))
		return 0
	}
	if err := validateFlags(f); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		return 2
	}
	receiptKey, _ := parseNamespacedName(f.receiptKey)
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	return serve(f, receiptKey)
}

// bindManagerFlags registers the operator's own flags on fs, storing into f.
func bindManagerFlags(fs *flag.FlagSet, f *managerFlags) {
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "address the metrics endpoint binds to; 0 disables it")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address the health and readiness probes bind to")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "", "address Go's profiling endpoints (/debug/pprof) bind to; empty: off. Bind it to 127.0.0.1: profiles are not authenticated")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "elect a leader so that only one manager acts at a time")
	fs.StringVar(&f.leaderElectionNS, "leader-election-namespace", "", "namespace of the leader election lease (default: the manager's own)")
	fs.DurationVar(&f.storeRecheck, "store-recheck-interval", 5*time.Minute, "how often a Ready MemoryStore is probed and audited again")
	fs.DurationVar(&f.probeTimeout, "probe-timeout", 10*time.Second, "bound on each connectivity or audit check")
	fs.IntVar(&f.redactionSample, "redaction-sample-rows", 200, "values of each redacted column a store audit samples for unredacted secrets and personal data (0: check the triggers only)")
	fs.IntVar(&f.pgMaxConns, "postgres-max-conns", 4, "connections per MemoryStore database pool")
	fs.DurationVar(&f.vacuumGap, "vacuum-gap", 5*time.Second, "least time between the end of a store's post-deletion vacuum that vacuumed a table and the start of its next; the deletions finishing meanwhile share that next one (each vacuum reads the tables' indexes whole)")
	fs.DurationVar(&f.reverify, "reverify-interval", time.Hour, "how often a completed ErasureRequest is checked for resurrected sessions")
	fs.DurationVar(&f.minGrace, "min-grace-period", lethev1.DefaultMinGracePeriod,
		"the shortest spec.gracePeriod a request that is not immediate may have; a shorter one stalls the request before anything is touched")
	fs.DurationVar(&f.planTTL, "plan-ttl", controllers.DefaultPlanTTL, "how long a planning request (kubectl erasure plan) its plugin left behind stays after its plan before the manager deletes it")
	fs.IntVar(&f.batchSize, "delete-batch-size", 100, "sessions deleted per database transaction")
	fs.IntVar(&f.probeBudget, "residue-probe-budget", 64, "erased embeddings per request that the residue probe queries; it also bounds the passages of erased text the text probe looks for (at most 16); 0 turns both probes off")
	fs.IntVar(&f.graphBatch, "graph-batch-size", 50, "erased sessions pruned from the graph per batch (one receipt each)")
	fs.IntVar(&f.graphDeleteLimit, "graph-delete-limit", 1000, "graph elements one delete query removes at most (FalkorDB has crashed on very large single deletes)")
	fs.IntVar(&f.sweepMaxOrphanPercent, "sweep-max-orphan-percent", 50, "refuse a graph sweep that would remove more than this percentage of the graph's sessions or facts; 100 disables the guard")
	fs.DurationVar(&f.errorBackoffMax, "error-backoff-max", 5*time.Minute, "longest wait before an ErasureRequest whose pass failed (an unreachable database, graph or API server) is tried again; the wait doubles from 1s after each failure")
	fs.DurationVar(&f.backupRecheck, "backup-recheck-interval", 10*time.Minute, "longest wait between checks of Velero Backups still expiring (a request also rechecks at the next expiration)")
	fs.Float64Var(&f.kubeQPS, "kube-api-qps", 100, "queries per second the manager's Kubernetes client may send")
	fs.IntVar(&f.kubeBurst, "kube-api-burst", 200, "burst above --kube-api-qps the Kubernetes client may send")
	fs.StringVar(&f.receiptKey, "receipt-key-secret", "", "NAMESPACE/NAME of the Secret whose "+controllers.ReceiptPrivateKey+" (PEM ed25519) signs receipts; the public key is published in a ConfigMap of the same name. Empty: receipts are unsigned")
	fs.StringVar(&f.recordKey, "record-key-secret", "", "NAMESPACE/NAME of the Secret (created when absent) whose key hashes the session IDs in each MemoryStore's erasure record, so that a restore stays detectable after a request object is deleted; use the manager's own namespace. Empty: no record is kept")
	fs.BoolVar(&f.receiptKeyCreate, "receipt-key-create", true, "create the --receipt-key-secret Secret with a new ed25519 key when it does not exist (an Event on the Secret says so); false: a missing Secret makes receipts wait for it")
	fs.IntVar(&f.concurrency, "max-concurrent-reconciles", 4, "ErasureRequests worked on at once")
	fs.DurationVar(&f.secretTTL, "secret-cache-ttl", 5*time.Second, "how long a store's Secret value (DSN, graph URL) read from the API server is reused; a rotated value is picked up within it (0: read on every pass)")
	fs.BoolVar(&f.stripManagedFields, "cache-strip-managed-fields", true, "drop metadata.managedFields from cached objects (the manager never reads them; P4 measures the memory this saves)")
}

// setupFailure is a setup step that failed: the message the setup log gives
// it and its cause.
type setupFailure struct {
	msg string
	err error
}

// serve builds the manager, its connectors and its controllers, and runs it
// until it is signalled to stop. It returns the process's exit code.
func serve(f managerFlags, receiptKey types.NamespacedName) int {
	log := ctrl.Log.WithName("setup")
	mgr, cfg, fail := newManager(f)
	if fail != nil {
		log.Error(fail.err, fail.msg)
		return 1
	}

	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		log.Error(err, "create discovery client")
		return 1
	}
	pools := &postgres.Pools{Options: postgres.Options{MaxConns: int32(f.pgMaxConns), ApplicationName: "lethe-manager", Vector: true, VacuumGap: f.vacuumGap}}
	defer pools.Close()
	graphs := &graph.Clients{}
	defer graphs.Close()
	detector := backups.Detector{Discovery: disc}
	conn := &connector.Connector{Secrets: mgr.GetAPIReader(), SecretTTL: f.secretTTL, Pools: pools, Graphs: graphs, Velero: backups.Velero{
		Detector: detector, Rotator: backups.Rotator{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Concurrency: 8}}}

	if fail := addControllers(mgr, f, receiptKey, conn, detector); fail != nil {
		log.Error(fail.err, fail.msg)
		return 1
	}
	if fail := addChecks(mgr); fail != nil {
		log.Error(fail.err, fail.msg)
		return 1
	}

	v := version.Get()
	log.Info("starting manager", "version", v.Version, "gitCommit", v.GitCommit, "buildDate", v.BuildDate,
		"leaderElection", f.leaderElect, "storeRecheckInterval", f.storeRecheck.String())
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		return 1
	}
	return 0
}

// newScheme registers the client-go, Lethe and Velero types.
func newScheme() (*runtime.Scheme, *setupFailure) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, &setupFailure{"register client-go types", err}
	}
	if err := lethev1.AddToScheme(scheme); err != nil {
		return nil, &setupFailure{"register Lethe types", err}
	}
	// Velero's types are read and written uncached: its CRDs may be
	// installed after the manager starts.
	if err := velerov1.AddToScheme(scheme); err != nil {
		return nil, &setupFailure{"register Velero types", err}
	}
	return scheme, nil
}

// newManager creates the controller-runtime manager (its client, cache,
// metrics, probes and leader election) and returns it with its REST config.
func newManager(f managerFlags) (ctrl.Manager, *rest.Config, *setupFailure) {
	scheme, fail := newScheme()
	if fail != nil {
		return nil, nil, fail
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, nil, &setupFailure{"no Kubernetes configuration: pass --kubeconfig or run in a cluster", err}
	}
	// The backup step writes one patch per Backup: at 100 QPS, 1,000 Backups
	// take 8 s (P6); client-go's default of 20 would take 50 s.
	cfg.QPS, cfg.Burst = float32(f.kubeQPS), f.kubeBurst
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: f.metricsAddr},
		HealthProbeBindAddress:        f.probeAddr,
		PprofBindAddress:              f.pprofAddr,
		LeaderElection:                f.leaderElect,
		LeaderElectionID:              "lethe-manager.erasure.lethe.dev",
		LeaderElectionNamespace:       f.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		Client: client.Options{Cache: &client.CacheOptions{
			// Secrets are read straight from the API server, never cached cluster-wide.
			DisableFor: []client.Object{&corev1.Secret{}},
		}},
		Cache: controllers.CacheOptions(f.stripManagedFields),
	})
	if err != nil {
		return nil, nil, &setupFailure{"create manager", err}
	}
	return mgr, cfg, nil
}

// addControllers sets up the MemoryStore and ErasureRequest controllers and,
// when receipts are signed, the runnable that makes sure the key exists.
func addControllers(mgr ctrl.Manager, f managerFlags, receiptKey types.NamespacedName, conn *connector.Connector, detector backups.Detector) *setupFailure {
	// The MemoryStore audit hands the requests a restore took erasures from
	// to the ErasureRequest controller.
	reverify := make(chan event.TypedGenericEvent[client.Object], 1024)
	withheld := &controllers.WithheldInclusions{}
	var records *controllers.ErasureRecords
	if recordKey, _ := parseNamespacedName(f.recordKey); recordKey.Name != "" {
		records = &controllers.ErasureRecords{Connector: conn,
			Keeper: &storerecord.Keeper{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), KeySecret: recordKey}}
	} else {
		ctrl.Log.Info("no --record-key-secret: no erasure record is kept, and a restore after a request object is deleted goes unseen")
	}
	if err := (&controllers.MemoryStoreReconciler{
		Client:                 mgr.GetClient(),
		Records:                records,
		BatchSize:              f.batchSize,
		Recorder:               mgr.GetEventRecorder("lethe-memorystore"),
		Connector:              conn,
		Reverify:               reverify,
		Withheld:               withheld,
		Velero:                 detector,
		RecheckInterval:        f.storeRecheck,
		ProbeTimeout:           f.probeTimeout,
		RedactionSample:        f.redactionSample,
		SweepMaxOrphanFraction: float64(f.sweepMaxOrphanPercent) / 100,
		// The key set is published in the ConfigMap of the Secret's name.
		ReceiptKeySet: receiptKey,
		APIReader:     mgr.GetAPIReader(),
	}).SetupWithManager(mgr); err != nil {
		return &setupFailure{"set up the MemoryStore controller", err}
	}

	if err := (&controllers.ErasureRequestReconciler{
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		SecretReader:            mgr.GetAPIReader(),
		Records:                 records,
		Recorder:                mgr.GetEventRecorder("lethe-erasurerequest"),
		Connector:               conn,
		Reverify:                reverify,
		Withheld:                withheld,
		Velero:                  detector,
		BackupRecheck:           f.backupRecheck,
		ReceiptKeySecret:        receiptKey,
		MaxConcurrentReconciles: f.concurrency,
		GraphBatch:              f.graphBatch,
		GraphDeleteLimit:        f.graphDeleteLimit,
		ReverifyInterval:        f.reverify,
		MinGracePeriod:          f.minGrace,
		BackoffMax:              f.errorBackoffMax,
		PlanTTL:                 f.planTTL,
		BatchSize:               f.batchSize,
		ProbeBudget:             f.probeBudget,
	}).SetupWithManager(mgr); err != nil {
		return &setupFailure{"set up the ErasureRequest controller", err}
	}

	if receiptKey.Name != "" {
		// Receipts are signed from the first install: the key is made if missing.
		if err := mgr.Add(&controllers.ReceiptKeySetup{
			Client:   mgr.GetClient(),
			Reader:   mgr.GetAPIReader(),
			Recorder: mgr.GetEventRecorder("lethe-receipt-key"),
			Secret:   receiptKey,
			Create:   f.receiptKeyCreate,
		}); err != nil {
			return &setupFailure{"set up the receipt signing key", err}
		}
	}
	return nil
}

// addChecks adds the health and readiness probes.
func addChecks(mgr ctrl.Manager) *setupFailure {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return &setupFailure{"add health check", err}
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return &setupFailure{"add readiness check", err}
	}
	return nil
}

// flagCheck is one rule of validateFlags: when bad, the flag is refused with
// the error fmt.Errorf(format, args...).
type flagCheck struct {
	bad    bool
	format string
	args   []any
}

// validateFlags refuses nonsense before anything starts. Every problem is
// reported, in one joined error.
func validateFlags(f managerFlags) error {
	_, receiptKeyErr := parseNamespacedName(f.receiptKey)
	_, recordKeyErr := parseNamespacedName(f.recordKey)
	checks := []flagCheck{
		{f.storeRecheck < 10*time.Second, "--store-recheck-interval must be at least 10s, got %s", []any{f.storeRecheck}},
		{f.probeTimeout <= 0, "--probe-timeout must be positive, got %s", []any{f.probeTimeout}},
		{f.redactionSample < 0 || f.redactionSample > 10000, "--redaction-sample-rows must be between 0 and 10000, got %d", []any{f.redactionSample}},
		{f.planTTL < time.Minute, "--plan-ttl must be at least 1m, got %s", []any{f.planTTL}},
		{f.reverify < time.Minute, "--reverify-interval must be at least 1m, got %s", []any{f.reverify}},
		{f.minGrace <= 0, "--min-grace-period must be positive (a request without a grace period must be immediate, with a reason), got %s", []any{f.minGrace}},
		{f.errorBackoffMax < time.Second || f.errorBackoffMax > time.Hour, "--error-backoff-max must be between 1s and 1h, got %s", []any{f.errorBackoffMax}},
		{f.batchSize < 1 || f.batchSize > 1000, "--delete-batch-size must be between 1 and 1000, got %d", []any{f.batchSize}},
		{f.graphBatch < 1 || f.graphBatch > 1000, "--graph-batch-size must be between 1 and 1000, got %d", []any{f.graphBatch}},
		{f.graphDeleteLimit < 1 || f.graphDeleteLimit > 100000, "--graph-delete-limit must be between 1 and 100000, got %d", []any{f.graphDeleteLimit}},
		{f.sweepMaxOrphanPercent < 1 || f.sweepMaxOrphanPercent > 100, "--sweep-max-orphan-percent must be between 1 and 100, got %d", []any{f.sweepMaxOrphanPercent}},
		{f.secretTTL < 0 || f.secretTTL > 5*time.Minute, "--secret-cache-ttl must be between 0 and 5m, got %s", []any{f.secretTTL}},
		{f.kubeQPS <= 0 || f.kubeBurst < 1, "--kube-api-qps and --kube-api-burst must be positive, got %v and %d", []any{f.kubeQPS, f.kubeBurst}},
		{receiptKeyErr != nil, "--receipt-key-secret: %w", []any{receiptKeyErr}},
		{recordKeyErr != nil, "--record-key-secret: %w", []any{recordKeyErr}},
		{f.concurrency < 1 || f.concurrency > 64, "--max-concurrent-reconciles must be between 1 and 64, got %d", []any{f.concurrency}},
		{f.backupRecheck < time.Second, "--backup-recheck-interval must be at least 1s, got %s", []any{f.backupRecheck}},
		{f.probeBudget < 0 || f.probeBudget > 10000, "--residue-probe-budget must be between 0 and 10000, got %d", []any{f.probeBudget}},
		{f.pgMaxConns < 1 || f.pgMaxConns > 100, "--postgres-max-conns must be between 1 and 100, got %d", []any{f.pgMaxConns}},
		{f.vacuumGap < 0 || f.vacuumGap > 10*time.Minute, "--vacuum-gap must be between 0 and 10m, got %s", []any{f.vacuumGap}},
	}
	var errs []error
	for _, c := range checks {
		if c.bad {
			errs = append(errs, fmt.Errorf(c.format, c.args...))
		}
	}
	return errors.Join(errs...)
}

// parseNamespacedName parses "namespace/name" ("" is the zero value).
func parseNamespacedName(s string) (types.NamespacedName, error) {
	if s == "" {
		return types.NamespacedName{}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("want NAMESPACE/NAME, got %q", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
