package postgres_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/lethe-dev/lethe/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) {
	var err error
	pg, err = testenv.StartPostgres()
	if err != nil {
		// A missing service is a failure with the command to run, never a skip.
		fmt.Fprintln(os.Stderr, "FAIL: cannot start PostgreSQL for the tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Stop()
	os.Exit(code)
}

// migratedDB returns the DSN of a fresh database with every migration applied.
func migratedDB(t testing.TB) string {
	t.Helper()
	dsn, err := pg.MigratedDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}
