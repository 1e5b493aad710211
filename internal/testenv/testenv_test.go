package testenv_test

import (
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/testenv"
)

// A missing service is an error that says what to run, never a silent skip.
func TestMissingBinariesSayWhatToRun(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", empty)
	t.Setenv("LETHE_PG_BIN", empty)
	t.Setenv("LETHE_FALKORDB_MODULE", empty+"/falkordb.so")
	t.Setenv("LETHE_VALKEY_SERVER", empty+"/valkey-server")

	_, err := testenv.StartControlPlane()
	wantMake(t, err, "make envtest-assets")
	_, err = testenv.StartPostgres()
	wantMake(t, err, "make postgres")
	_, err = testenv.StartFalkorDB()
	wantMake(t, err, "make falkordb")
	t.Setenv("LETHE_VELERO", empty+"/velero")
	_, err = testenv.StartVelero(nil, testenv.VeleroOptions{})
	wantMake(t, err, "make velero")
}

func wantMake(t *testing.T, err error, cmd string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), cmd) {
		t.Errorf("want an error telling to run %q, got %v", cmd, err)
	}
}

func TestPostgresStartsAndStops(t *testing.T) {
	pg, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	port := pg.Port
	pg.Stop()
	if p, err := testenv.FreePort(); err != nil || p == 0 {
		t.Fatalf("free port: %d %v", p, err)
	}
	// The server is gone: its port accepts no connection.
	if err := pg.Exec(t.Context(), "postgres", "SELECT 1"); err == nil {
		t.Fatalf("postgres on port %d still answers after Stop", port)
	}
}
