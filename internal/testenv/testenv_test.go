package testenv_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/graph"
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

// DeleteGraph removes the graph it names, and only that one; a graph
// that does not exist is not an error.
func TestFalkorDBDeletesAGraph(t *testing.T) {
	ctx := t.Context()
	f, err := testenv.StartFalkorDB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	c, err := graph.Open(f.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, key := range []string{"done", "kept"} {
		if _, err := c.Graph(key).Query(ctx, "CREATE (:Entity {key: 'k'})", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.DeleteGraph("done"); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteGraph("never-made"); err != nil {
		t.Fatalf("a graph that does not exist: %v", err)
	}
	graphs, err := f.Graphs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(graphs, []string{"kept"}) {
		t.Errorf("graphs after deleting done: %q, want only kept", graphs)
	}
	els, err := testenv.GraphElements(ctx, c.Graph("kept"))
	if err != nil || len(els) != 1 {
		t.Errorf("the graph kept: %v, %v; want its one node", els, err)
	}
}
