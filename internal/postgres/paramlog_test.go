package postgres_test

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// The samples a deletion sends back to the database for its checks reach
// the server's log when it logs statements, unless the role's
// log_parameter_max_length is 0; the audit tells which, read in the role's
// own session. The server here logs every statement of the manager's role
// (log_min_duration_statement = 0, set for that role in that database
// only, so that the seeding's own statements stay out of the log), and the
// test reads what it wrote during the erasure.
func TestErasedTextReachesTheServerLogOnlyWhereParametersAreLogged(t *testing.T) {
	fix := []string{"log_parameter_max_length = 0", "log_parameter_max_length_on_error = 0"}
	for _, tc := range []struct {
		name     string
		settings []string
		// late: the fix comes after the pool's connections started.
		late     bool
		unlogged bool
	}{
		{name: "with the fix the condition gives", settings: fix, unlogged: true},
		{name: "with the fix made while the manager was connected", settings: fix, late: true, unlogged: true},
		{name: "with the server's defaults"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dsn := migratedDB(t)
			seedTextResidue(t, dsn)
			admin := connect(t, dsn)
			u, err := url.Parse(dsn)
			if err != nil {
				t.Fatal(err)
			}
			db := strings.TrimPrefix(u.Path, "/")
			login := "lethe_test_paramlog"
			mdsn := asRole(t, admin, dsn, login, "lethe_operator")
			set := func(settings ...string) {
				for _, s := range settings {
					mustExec(t, admin, `ALTER ROLE `+login+` IN DATABASE "`+db+`" SET `+s)
				}
			}
			set("log_min_duration_statement = 0")
			if !tc.late {
				set(tc.settings...)
			}
			pool, err := postgres.Connect(ctx, mdsn, postgres.Options{Vector: true, MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if tc.late {
				// Both of the pool's connections start without the fix.
				c1, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				c2, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				c1.Release()
				c2.Release()
				set(tc.settings...)
			}

			p, err := postgres.AuditPoolParameterLogging(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if p.Role != login || p.Unlogged() != tc.unlogged || !slices.Contains(p.LoggingNow, "log_min_duration_statement = 0") {
				t.Fatalf("audit: %+v, want role %s, unlogged %v, logging now by duration", p, login, tc.unlogged)
			}

			from := len(pg.ServerLog())
			e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
			req := erasure.Request{UID: "uid-paramlog", SessionIDs: []string{sessA}}
			if _, err := e.Tombstone(ctx, req); err != nil {
				t.Fatal(err)
			}
			res, err := e.Delete(ctx, req, 10, 8)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Texts) == 0 {
				t.Fatal("the deletion sampled no text: nothing would be sent")
			}
			if _, err := e.ProbeTextResidue(ctx, res.Texts); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Verify(ctx, req, res.ContentKeys); err != nil {
				t.Fatal(err)
			}
			log := pg.ServerLog()[from:]
			// The probe's statement is in the log either way: the test
			// would pass vacuously if nothing were logged.
			if !strings.Contains(log, "strpos") {
				t.Fatalf("the server logged no text probe statement of the role; its log since the erasure:\n%.2000s", log)
			}
			var leaked []string
			for _, w := range []string{"Kowalski", "dementia", "Guardian", "pension"} {
				if strings.Contains(log, w) {
					leaked = append(leaked, w)
				}
			}
			switch {
			case tc.unlogged && len(leaked) > 0:
				t.Errorf("erased text in the server log (%v) with the role's parameters unlogged", leaked)
			case !tc.unlogged && len(leaked) == 0:
				t.Errorf("no erased text in the server log with the default settings: the test cannot see a leak")
			}
		})
	}
}
