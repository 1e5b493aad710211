package postgres_test

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/graph"
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
	for _, tc := range []struct {
		name     string
		settings []string
		unlogged bool
		source   string
	}{
		{name: "with the fix the condition gives", settings: []string{"log_parameter_max_length = 0"}, unlogged: true, source: "database user"},
		// The role's own log_parameter_max_length_on_error does not hold: the
		// manager sets it to 0 in its sessions.
		{name: "with the server's defaults", settings: []string{"log_parameter_max_length_on_error = -1"}, source: "default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			l := newLoggedRole(t)
			l.set(t, tc.settings...)
			pool, err := postgres.Connect(ctx, l.dsn, postgres.Options{Vector: true})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			p, err := postgres.AuditParameterLogging(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if p.Role != l.login || p.Database != l.db || p.Unlogged() != tc.unlogged || p.MaxLengthOnError != 0 || p.MaxLengthSource != tc.source ||
				!slices.Contains(p.LoggingNow, "log_min_duration_statement = 0") || len(p.ValuesLoggedBy) != 0 {
				t.Fatalf("audit: %+v, want role %s in %s, unlogged %v (from %s), nothing on error, logging now by duration", p, l.login, l.db, tc.unlogged, tc.source)
			}
			leaked := eraseAndReadLog(t, &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}, tc.name)
			switch {
			case tc.unlogged && len(leaked) > 0:
				t.Errorf("erased data in the server log (%v) with the role's parameters unlogged", leaked)
			case !tc.unlogged && len(leaked) == 0:
				t.Errorf("no erased data in the server log with the default settings: the test cannot see a leak")
			}
		})
	}
}

// A fix made while the manager's pool was connected reaches its open
// connections only through the audit's pool reset (connector). The audit
// reports a pooled session that logs until then (here one of two idle
// ones, the other opened after the fix), the erasure after it leaves
// nothing in the log, and an audit that finds nothing changed, or a change
// towards logging, leaves the pool alone. A change the idle sessions do
// not show (a session opened while the fix was withdrawn, in use during
// the audit) is found by comparing with the last audit's new session.
func TestAFixMadeWhileConnectedReachesThePoolThroughTheAudit(t *testing.T) {
	ctx := context.Background()
	l := newLoggedRole(t)
	store := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "memory"},
		Spec: lethev1.MemoryStoreSpec{TenantID: "t1", Postgres: lethev1.PostgresSpec{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}}}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"}, Data: map[string][]byte{"dsn": []byte(l.dsn)}}
	c := &connector.Connector{Secrets: fake.NewClientBuilder().WithObjects(secret).Build(), Pools: &postgres.Pools{Options: postgres.Options{Vector: true, MaxConns: 3}}, Graphs: &graph.Clients{}}
	defer c.Pools.Close()
	e, err := c.Ledger(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	pool := e.Pool.(*pgxpool.Pool)
	// audit fails the test unless the audit reads as want; it runs release
	// first (a pool with a session in use would not close).
	audit := func(what string, unlogged bool, release ...*pgxpool.Conn) {
		t.Helper()
		p, err := c.AuditParameterLogging(ctx, store)
		for _, r := range release {
			r.Release()
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.Unlogged() != unlogged {
			t.Fatalf("%s: %+v, want unlogged %v", what, p, unlogged)
		}
	}
	acquire := func() *pgxpool.Conn {
		t.Helper()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	// One connection opened before the fix, one after, both idle; no
	// audit before.
	old := acquire()
	l.set(t, "log_parameter_max_length = 0")
	fixed := acquire()
	old.Release()
	fixed.Release()
	audit("the audit that finds a pooled session logging", false)
	audit("the audit after the pool's reset", true)
	if leaked := eraseAndReadLog(t, e, "late fix"); len(leaked) > 0 {
		t.Errorf("erased data in the server log (%v) after the audit found the fix", leaked)
	}
	steady := idleBackends(t, pool)
	audit("a steady audit", true)
	if after := idleBackends(t, pool); len(steady) == 0 || !slices.Equal(steady, after) {
		t.Errorf("an audit that found nothing changed replaced the pool's sessions: backends %v, then %v", steady, after)
	}

	// Withdrawn: new sessions log, the pool's do not; nothing is reset.
	l.set(t, "log_parameter_max_length = -1")
	audit("the audit after the fix was withdrawn", false)
	if after := idleBackends(t, pool); !slices.Equal(steady, after) {
		t.Errorf("a change towards logging replaced the pool's sessions: backends %v, then %v", steady, after)
	}
	// A session opened now logs; it is in use through the next audit,
	// the pool's idle ones do not log.
	idle := pool.AcquireAllIdle(ctx)
	inUse := acquire()
	logging := inUse.Conn().PgConn().PID()
	for _, c := range idle {
		c.Release()
	}
	l.set(t, "log_parameter_max_length = 0")
	audit("the audit that finds the fix again, with a logging session in use", false, inUse)
	audit("the audit after", true)
	if slices.Contains(idleBackends(t, pool), logging) {
		t.Errorf("the session opened while the fix was withdrawn (backend %d) is still in the pool", logging)
	}
}

// idleBackends are the server process IDs of pool's idle sessions, sorted.
func idleBackends(t *testing.T, pool *pgxpool.Pool) []uint32 {
	t.Helper()
	var out []uint32
	for _, c := range pool.AcquireAllIdle(context.Background()) {
		out = append(out, c.Conn().PgConn().PID())
		c.Release()
	}
	slices.Sort(out)
	return out
}

// loggedRole is a login role (a member of lethe_operator) whose statements
// the server logs, all of them, in a new migrated database seeded with
// session A's text (seedTextResidue) and embeddings.
type loggedRole struct {
	admin          *pgx.Conn
	login, db, dsn string
}

func newLoggedRole(t *testing.T) loggedRole {
	t.Helper()
	dsn := migratedDB(t)
	seedTextResidue(t, dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	l := loggedRole{admin: connect(t, dsn), login: "lethe_test_paramlog", db: strings.TrimPrefix(u.Path, "/")}
	l.dsn = asRole(t, l.admin, dsn, l.login, "lethe_operator")
	// The role's sessions run as lethe_operator (current_user), as a role
	// setting can make them: the settings are still the login role's.
	l.set(t, "log_min_duration_statement = 0", "role = 'lethe_operator'")
	// A's rounds get an embedding whose text form no other test uses.
	mustExec(t, l.admin, `UPDATE memory.rounds SET embedding = array_fill(0.7654321::real, ARRAY[384])::vector WHERE session_id = $1`, sessA)
	return l
}

// set gives the role settings in this database only (new sessions).
func (l loggedRole) set(t *testing.T, settings ...string) {
	t.Helper()
	for _, s := range settings {
		mustExec(t, l.admin, `ALTER ROLE `+l.login+` IN DATABASE "`+l.db+`" SET `+s)
	}
}

// eraseAndReadLog erases session A through e with every check that sends
// samples (text and vector residue probes, the verification), and returns
// the words of A's text and the embedding's value that the server's log
// holds since.
func eraseAndReadLog(t *testing.T, e *postgres.Eraser, name string) []string {
	t.Helper()
	ctx := context.Background()
	from := len(pg.ServerLog())
	req := erasure.Request{UID: "uid-paramlog", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 10, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Texts) == 0 || len(res.Probe) == 0 {
		t.Fatalf("the deletion sampled %d passages and %d embeddings: nothing would be sent", len(res.Texts), len(res.Probe))
	}
	if _, err := e.ProbeTextResidue(ctx, res.Texts); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ProbeResidue(ctx, res.Probe, 1e-6); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Verify(ctx, req, res.ContentKeys); err != nil {
		t.Fatal(err)
	}
	// A failing statement's parameters: the manager's sessions set
	// log_parameter_max_length_on_error to 0 whatever the role's.
	if _, err := e.Pool.Exec(ctx, `SELECT 1/0 WHERE $1::text IS NOT NULL`, "Zebrafinch"); err == nil {
		t.Fatal("the statement meant to fail did not")
	}
	log := logThrough(t, e, from, name)
	if !strings.Contains(log, "division by zero") || strings.Contains(log, "Zebrafinch") {
		t.Errorf("a failing statement's parameter in the server log (or the failure not logged at all):\n%.3000s", log)
	}
	// The probe's statement is in the log either way: the test would pass
	// vacuously if nothing were logged.
	if !strings.Contains(log, "strpos") {
		t.Fatalf("the server logged no text probe statement of the role; its log since the erasure:\n%.2000s", log)
	}
	var leaked []string
	for _, w := range []string{"Kowalski", "dementia", "Guardian", "pension", "0.7654321"} {
		if strings.Contains(log, w) {
			leaked = append(leaked, w)
		}
	}
	return leaked
}

// logThrough is the server's log from offset from, once it holds a marker
// statement e's role ran after everything before it: the server's output
// reaches the buffer asynchronously, and a log read too early would miss
// what the test looks for.
func logThrough(t *testing.T, e *postgres.Eraser, from int, name string) string {
	t.Helper()
	marker := "lethe-log-marker " + strings.ReplaceAll(name, "'", "")
	if _, err := e.Pool.Exec(context.Background(), `SELECT '`+marker+`'`); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		log := pg.ServerLog()[from:]
		if strings.Contains(log, marker) {
			return log
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server logged no marker statement of the role within 10 s; its log since:\n%.2000s", log)
		}
	}
}

// The audit names every setting that writes a statement's values into the
// server log, as the session has it, and none that does not; it reads
// pg_settings (which builds a row for every setting the server knows) once.
// pgaudit is not installed in the test server: its arm is not exercised.
func TestTheParameterLoggingAuditNamesEverySettingThatLogsValues(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	read := func() postgres.ParameterLogging {
		t.Helper()
		p, err := postgres.AuditParameterLogging(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mustExec(t, conn, `SET log_parameter_max_length = 0`)
	mustExec(t, conn, `SET log_parameter_max_length_on_error = 0`)
	if p := read(); !p.Unlogged() || len(p.LoggingNow) != 0 || p.MaxLengthSource != "session" {
		t.Fatalf("nothing logged: %+v, want unlogged, no logging now, the length from the session", p)
	}
	// Settings that log, but not the statements Lethe sends samples with,
	// or not at all (auto_explain loaded, at its default).
	mustExec(t, conn, `LOAD 'auto_explain'`)
	for _, s := range []string{`log_statement = 'ddl'`, `log_min_duration_statement = -1`, `log_min_duration_sample = 5`,
		`log_statement_sample_rate = 0`, `log_transaction_sample_rate = 0`, `debug_print_plan = off`} {
		mustExec(t, conn, `SET `+s)
	}
	if p := read(); len(p.LoggingNow) != 0 || len(p.ValuesLoggedBy) != 0 {
		t.Fatalf("no setting that covers Lethe's statements: %+v, want none named", p)
	}
	for _, s := range []string{`log_statement = 'mod'`, `log_min_duration_statement = 0`, `log_statement_sample_rate = 0.5`,
		`log_transaction_sample_rate = 0.1`, `log_parameter_max_length = 64`, `log_parameter_max_length_on_error = -1`,
		`debug_print_parse = on`, `debug_print_rewritten = on`, `debug_print_plan = on`} {
		mustExec(t, conn, `SET `+s)
	}
	mustExec(t, conn, `SET auto_explain.log_min_duration = 0`)
	p := read()
	wantNow := []string{"log_min_duration_sample = 5", "log_min_duration_statement = 0", "log_statement = mod", "log_transaction_sample_rate = 0.1"}
	wantValues := []string{"auto_explain.log_min_duration = 0", "debug_print_parse = on", "debug_print_plan = on", "debug_print_rewritten = on"}
	if !slices.Equal(p.LoggingNow, wantNow) || !slices.Equal(p.ValuesLoggedBy, wantValues) || p.MaxLength != 64 || p.MaxLengthOnError != -1 || p.Unlogged() {
		t.Fatalf("every setting logging: %+v, want logging now by %v, values logged by %v, 64 bytes and every byte on error", p, wantNow, wantValues)
	}
	mustExec(t, conn, `SET log_statement = 'all'`)
	if p := read(); !slices.Contains(p.LoggingNow, "log_statement = all") {
		t.Fatalf("log_statement = all: %+v, want it named", p)
	}
	// Not the EXPLAIN below into the server's log.
	mustExec(t, conn, `RESET ALL`)

	plan := strings.Join(queryStrings(t, conn, `EXPLAIN `+postgres.ParameterLoggingSQL), "\n")
	if n := strings.Count(plan, "Function Scan on pg_show_all_settings"); n != 1 {
		t.Errorf("the audit reads pg_settings %d times, want once:\n%s", n, plan)
	}
}
