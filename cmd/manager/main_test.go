package main

import (
	"context"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/testenv"
	"github.com/lethe-dev/lethe/migrations"
)

// latestMigration is the highest version among the embedded migrations.
func latestMigration(t *testing.T) int64 {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded migrations: %v (%d files)", err, len(files))
	}
	var latest int64
	for _, f := range files {
		v, err := strconv.ParseInt(strings.SplitN(f, "_", 2)[0], 10, 64)
		if err != nil {
			t.Fatalf("migration %s has no version: %v", f, err)
		}
		latest = max(latest, v)
	}
	return latest
}

func TestMigrateCommandAppliesAndReportsTheVersion(t *testing.T) {
	pg, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	ctx := context.Background()
	db, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ {
		if code := runMigrate([]string{"--dsn", pg.DSN(db)}); code != 0 {
			t.Fatalf("run %d: migrate exited %d", run, code)
		}
	}
	conn, err := pgx.Connect(ctx, pg.DSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var version int64
	if err := conn.QueryRow(ctx, `SELECT max(version_id) FROM lethe_goose_db_version WHERE is_applied`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if want := latestMigration(t); version != want {
		t.Fatalf("database at version %d, want %d (the last embedded migration)", version, want)
	}

	// The DSN may come from the environment instead of the process list.
	t.Setenv("LETHE_PG_DSN", pg.DSN(db))
	if code := runMigrate(nil); code != 0 {
		t.Fatalf("migrate with LETHE_PG_DSN exited %d", code)
	}
}

func TestMigrateCommandRefusesBadArguments(t *testing.T) {
	t.Setenv("LETHE_PG_DSN", "")
	for _, args := range [][]string{nil, {"--dsn"}, {"--no-such-flag"}, {"--dsn", "x", "extra"}} {
		if code := runMigrate(args); code != 2 {
			t.Errorf("migrate %q exited %d, want 2 (usage error)", args, code)
		}
	}
}

func TestManagerFlagsAreValidated(t *testing.T) {
	ok := managerFlags{storeRecheck: time.Minute, probeTimeout: time.Second, pgMaxConns: 4, reverify: time.Hour, planTTL: 10 * time.Minute, batchSize: 100, probeBudget: 64,
		graphBatch: 50, graphDeleteLimit: 1000, sweepMaxOrphanPercent: 50, backupRecheck: time.Minute, errorBackoffMax: 5 * time.Minute, kubeQPS: 100, kubeBurst: 200, concurrency: 4,
		minGrace: time.Hour}
	if err := validateFlags(ok); err != nil {
		t.Fatalf("valid flags refused: %v", err)
	}
	for name, change := range map[string]func(*managerFlags){
		"--store-recheck-interval":    func(f *managerFlags) { f.storeRecheck = time.Second },
		"--probe-timeout":             func(f *managerFlags) { f.probeTimeout = 0 },
		"--postgres-max-conns":        func(f *managerFlags) { f.pgMaxConns = 0 },
		"--vacuum-gap":                func(f *managerFlags) { f.vacuumGap = -time.Second },
		"--reverify-interval":         func(f *managerFlags) { f.reverify = time.Second },
		"--min-grace-period":          func(f *managerFlags) { f.minGrace = 0 },
		"--record-key-secret":         func(f *managerFlags) { f.recordKey = "no-slash" },
		"--plan-ttl":                  func(f *managerFlags) { f.planTTL = time.Second },
		"--delete-batch-size":         func(f *managerFlags) { f.batchSize = 0 },
		"--residue-probe-budget":      func(f *managerFlags) { f.probeBudget = -1 },
		"--graph-batch-size":          func(f *managerFlags) { f.graphBatch = 0 },
		"--graph-delete-limit":        func(f *managerFlags) { f.graphDeleteLimit = 1e6 },
		"--sweep-max-orphan-percent":  func(f *managerFlags) { f.sweepMaxOrphanPercent = 101 },
		"--backup-recheck-interval":   func(f *managerFlags) { f.backupRecheck = 0 },
		"--error-backoff-max":         func(f *managerFlags) { f.errorBackoffMax = 2 * time.Hour },
		"--kube-api-qps":              func(f *managerFlags) { f.kubeQPS = 0 },
		"--secret-cache-ttl":          func(f *managerFlags) { f.secretTTL = -time.Second },
		"--max-concurrent-reconciles": func(f *managerFlags) { f.concurrency = 0 },
	} {
		f := ok
		change(&f)
		err := validateFlags(f)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v, want an error naming the flag", name, err)
		}
	}
	if err := validateFlags(managerFlags{}); err == nil || strings.Count(err.Error(), "--") != 15 {
		t.Errorf("want all fourteen problems (fifteen flags named) reported at once, got %v", fmt.Sprint(err))
	}
}
