// Command devstack runs Lethe's local dev stack in the foreground: the
// control plane (with Lethe's and Velero's CRDs), PostgreSQL with the
// reference schema migrated, FalkorDB, and a real Velero server (with its
// AWS plugin) storing its backups in an S3-compatible server. It writes a sourceable env file
// and stops every service by its PID on SIGINT/SIGTERM. hack/dev-stack.sh
// runs it in the background.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/testenv"
)

func main() {
	dir := flag.String("dir", ".dev", "folder for the env file and kubeconfig")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("devstack: "+format+"\n", args...) }

// run starts the services, writes the env file and kubeconfig into dir, and
// waits for a signal; the services stop when it returns.
func run(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	say("starting PostgreSQL with pgvector")
	pg, err := testenv.StartPostgres()
	if err != nil {
		return err
	}
	defer pg.Stop()
	dsn, err := migrateMemory(ctx, pg)
	if err != nil {
		return err
	}

	say("starting FalkorDB")
	fdb, err := testenv.StartFalkorDB()
	if err != nil {
		return err
	}
	defer fdb.Stop()
	say("FalkorDB on %s", fdb.Addr())

	say("starting kube-apiserver and etcd with the Lethe and Velero CRDs")
	lethe, err := testenv.LetheCRDDir()
	if err != nil {
		return err
	}
	// Velero's CRDs come from Velero's Go package, compiled in.
	cp, err := testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{CRDDirs: []string{lethe}, Velero: true})
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	kubeconfigPath, err := writeAdminKubeconfig(cp, dir)
	if err != nil {
		return err
	}
	say("kube-apiserver at %s", cp.Config.Host)

	say("starting Velero (namespace velero) and its object store")
	velero, err := testenv.StartVelero(cp.Config, testenv.VeleroOptions{Namespace: "velero"})
	if err != nil {
		return err
	}
	defer velero.Stop()
	say("Velero ready; its bucket %q is served at %s", testenv.VeleroBucket, velero.Store.URL)

	if err := writeEnv(dir, kubeconfigPath, dsn, fdb.URL(), velero.Store.URL); err != nil {
		return err
	}
	say("ready; env written to %s", filepath.Join(dir, "env"))

	<-ctx.Done()
	say("stopping")
	_ = os.Remove(filepath.Join(dir, "env"))
	return nil
}

// migrateMemory creates the memory database on pg, applies Lethe's
// migrations to it and returns its DSN.
func migrateMemory(ctx context.Context, pg *testenv.Postgres) (string, error) {
	if err := pg.Exec(ctx, "postgres", "CREATE DATABASE memory"); err != nil {
		return "", err
	}
	dsn := pg.DSN("memory")
	res, err := postgres.Migrate(ctx, dsn)
	if err != nil {
		return "", err
	}
	say("PostgreSQL on 127.0.0.1:%d, database memory migrated to version %d", pg.Port, res.Version)
	return dsn, nil
}

// writeAdminKubeconfig adds a cluster-admin user to the control plane and
// writes its kubeconfig to dir/kubeconfig, returning that path.
func writeAdminKubeconfig(cp *testenv.ControlPlane, dir string) (string, error) {
	admin, err := cp.Env.AddUser(envtest.User{Name: "dev-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		return "", err
	}
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return "", err
	}
	return kubeconfigPath, nil
}

// writeEnv writes the sourceable env file dir/env: written aside, then
// renamed into place.
func writeEnv(dir, kubeconfigPath, dsn, falkorURL, s3URL string) error {
	env := fmt.Sprintf(`# Written by hack/dev-stack.sh; source it: . .dev/env
export KUBECONFIG=%q
export LETHE_PG_DSN=%q
export LETHE_FALKORDB_URL=%q
export LETHE_S3_URL=%q
export LETHE_DEV_STACK_PID=%d
`, kubeconfigPath, dsn, falkorURL, s3URL, os.Getpid())
	tmp := filepath.Join(dir, "env.tmp")
	if err := os.WriteFile(tmp, []byte(env), 0o600); err != nil {
		return err
	}
	// The rename is the readiness signal hack/dev-stack.sh waits for.
	return os.Rename(tmp, filepath.Join(dir, "env"))
}
