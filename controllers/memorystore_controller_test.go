package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/testenv"
)

func newStore(ns string, mutate func(*lethev1.MemoryStore)) *lethev1.MemoryStore {
	s := &lethev1.MemoryStore{
		ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: ns},
		Spec: lethev1.MemoryStoreSpec{
			Postgres: lethev1.PostgresSpec{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

// waitCondition waits until the store's condition has the status and reason.
func waitCondition(t *testing.T, store *lethev1.MemoryStore, condType string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	return waitConditionIn(t, k8s, store, condType, status, reason)
}

// waitConditionIn is waitCondition against the API server of c.
func waitConditionIn(t *testing.T, c client.Client, store *lethev1.MemoryStore, condType string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	var found *metav1.Condition
	eventually(t, 30*time.Second, func() error {
		got := &lethev1.MemoryStore{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(store), got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, condType)
		if c == nil {
			return fmt.Errorf("no %s condition yet", condType)
		}
		if c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s is %s/%s (%s), want %s/%s", condType, c.Status, c.Reason, c.Message, status, reason)
		}
		if c.ObservedGeneration != got.Generation {
			return fmt.Errorf("%s describes generation %d, object is at %d", condType, c.ObservedGeneration, got.Generation)
		}
		found = c
		*store = *got
		return nil
	})
	return found
}

// Velero's CRDs are absent when the store is created and installed while the
// manager runs: the store waits, then becomes Ready without a restart (R4).
// The suite's control plane has Velero's CRDs from the start, so this test
// runs a control plane and a manager of its own.
func TestStoreWithEveryLayerBecomesReadyOnceVeleroIsInstalled(t *testing.T) {
	ctx := context.Background()
	own := startOwnCluster(t)
	c := own.c
	ns := newNamespaceIn(t, c, "ready")
	dsn := migratedDatabase(t)
	conn := connectVector(t, dsn)
	if err := fixture.Seed(ctx, conn, fixture.Session{ID: erasedA, Tenant: "default", Rounds: 1, Text: "x"}); err != nil {
		t.Fatal(err)
	}
	createSecretIn(t, c, ns, "pg", map[string]string{"dsn": dsn})
	createSecretIn(t, c, ns, "falkor", map[string]string{"url": fdb.URL()})
	store := newStore(ns, func(s *lethev1.MemoryStore) {
		s.Spec.FalkorDB = &lethev1.FalkorDBSpec{URLSecretRef: lethev1.SecretKeyRef{Name: "falkor", Key: "url"}}
		s.Spec.Velero = &lethev1.VeleroSpec{BackupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "memory"}}}
	})
	if err := c.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitConditionIn(t, c, store, lethev1.MemoryStoreBackupsReady, metav1.ConditionFalse, lethev1.ReasonVeleroNotInstalled)
	waitConditionIn(t, c, store, lethev1.MemoryStoreReady, metav1.ConditionFalse, lethev1.ReasonNotReady)
	// A request against the store erases in Postgres and waits at the backup step.
	er := &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "forget", Namespace: ns},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: store.Name},
			SessionIDs: []lethev1.SessionID{erasedA}, Immediate: true, Reason: "R4"},
	}
	if err := c.Create(ctx, er); err != nil {
		t.Fatal(err)
	}
	waitStepReasonIn(t, c, er, lethev1.ConditionBackupsRotated, lethev1.ReasonVeleroNotInstalled)

	if err := testenv.InstallVeleroCRDs(own.cp.Config); err != nil {
		t.Fatal(err)
	}
	waitConditionIn(t, c, store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	// The same manager, without a restart, sees Velero and completes the request.
	waitPhaseIn(t, c, er, lethev1.PhaseBackupsRotated)
	if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionBackupsRotated); c.Reason != lethev1.ReasonBackupsGone {
		t.Fatalf("BackupsRotated = %s/%s, want BackupsGone (no Backup exists)", c.Reason, c.Message)
	}
	for typ, reason := range map[string]string{
		lethev1.MemoryStorePostgresReady:   lethev1.ReasonConnected,
		lethev1.MemoryStoreSchemaCompliant: lethev1.ReasonCompliant,
		lethev1.MemoryStoreGraphReady:      lethev1.ReasonConnected,
		lethev1.MemoryStoreBackupsReady:    lethev1.ReasonVeleroInstalled,
	} {
		c := meta.FindStatusCondition(store.Status.Conditions, typ)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
			t.Errorf("%s = %+v, want True/%s", typ, c, reason)
		}
	}
	sch := store.Status.Schema
	if sch == nil || len(sch.Violations) != 0 || sch.CheckedAt == nil {
		t.Fatalf("schema status = %+v", sch)
	}
	wantTables := []string{"memory.artifacts", "memory.backfill_progress", "memory.fact_corrections", "memory.facts", "memory.file_snapshots", "memory.rounds"}
	if !slices.Equal(sch.CascadingTables, wantTables) {
		t.Errorf("cascading tables = %v, want %v", sch.CascadingTables, wantTables)
	}
	if want := []string{"memory.facts.embedding", "memory.rounds.embedding", "memory.sessions.summary_embedding"}; !slices.Equal(sch.VectorColumns, want) {
		t.Errorf("vector columns = %v, want %v", sch.VectorColumns, want)
	}
}

func TestBrokenSchemaMakesSchemaCompliantFalseNamingTheTable(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "broken")
	dsn := migratedDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, `CREATE TABLE memory.session_notes (
		id bigint PRIMARY KEY, session_id uuid NOT NULL REFERENCES memory.sessions (id), note text)`); err != nil {
		t.Fatal(err)
	}
	createSecret(t, ns, "pg", map[string]string{"dsn": dsn})
	store := newStore(ns, nil)
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	c := waitCondition(t, store, lethev1.MemoryStoreSchemaCompliant, metav1.ConditionFalse, lethev1.ReasonViolationsFound)
	if !strings.Contains(c.Message, "NoCascade memory.session_notes.session_id") {
		t.Errorf("SchemaCompliant message does not name the table: %q", c.Message)
	}
	waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionFalse, lethev1.ReasonNotReady)
	if v := store.Status.Schema.Violations; len(v) != 1 || v[0].Table != "memory.session_notes" || v[0].Rule != lethev1.RuleNoCascade {
		t.Errorf("violations = %+v", v)
	}

	// Fixing the schema is picked up by the periodic re-audit: the key
	// cascades, and the table, now holding a session's rows, hides a
	// tombstoned one as the reference tables do (forced row-level security,
	// the application's policy and Lethe's).
	if _, err := conn.Exec(ctx, `ALTER TABLE memory.session_notes DROP CONSTRAINT session_notes_session_id_fkey,
		ADD FOREIGN KEY (session_id) REFERENCES memory.sessions (id) ON DELETE CASCADE,
		ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
		CREATE POLICY app_live_session_rows ON memory.session_notes TO memory_app, memory_owner
			USING (EXISTS (SELECT 1 FROM memory.sessions s WHERE s.id = session_id));
		CREATE POLICY lethe_operator_all ON memory.session_notes TO lethe_operator USING (true) WITH CHECK (true)`); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStoreSchemaCompliant, metav1.ConditionTrue, lethev1.ReasonCompliant)
}

// ParametersUnlogged follows the manager role's logging settings: False
// with the fix while the role's parameters would be logged, True once a
// superuser applied it, though the manager's pool connected before that.
func TestParameterLoggingIsReportedUntilTheRoleIsFixed(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "paramlog")
	dsn := migratedDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	db := conn.Config().Database
	createSecret(t, ns, "pg", map[string]string{"dsn": dsn})
	// The suite's role has the fix; in this database only, it does not.
	if _, err := conn.Exec(ctx, `ALTER ROLE lethe_manager IN DATABASE "`+db+`" SET log_parameter_max_length = -1`); err != nil {
		t.Fatal(err)
	}
	store := newStore(ns, nil)
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	c := waitCondition(t, store, lethev1.MemoryStoreParametersUnlogged, metav1.ConditionFalse, lethev1.ReasonParametersLogged)
	if !strings.Contains(c.Message, `ALTER ROLE "lethe_manager" IN DATABASE "`+db+`" SET log_parameter_max_length = 0`) ||
		!strings.Contains(c.Message, "log_parameter_max_length = -1 (database user)") {
		t.Errorf("the condition does not give the setting and its fix: %q", c.Message)
	}
	waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	// The fix the message gives.
	if _, err := conn.Exec(ctx, `ALTER ROLE lethe_manager IN DATABASE "`+db+`" SET log_parameter_max_length = 0`); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStoreParametersUnlogged, metav1.ConditionTrue, lethev1.ReasonParameterLoggingOff)
}

func TestMissingSecretThenCreated(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "secret")
	store := newStore(ns, nil)
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	c := waitCondition(t, store, lethev1.MemoryStorePostgresReady, metav1.ConditionFalse, lethev1.ReasonSecretNotFound)
	if !strings.Contains(c.Message, ns+"/pg") {
		t.Errorf("message does not name the Secret: %q", c.Message)
	}
	waitCondition(t, store, lethev1.MemoryStoreSchemaCompliant, metav1.ConditionUnknown, lethev1.ReasonPostgresNotReady)

	createSecret(t, ns, "pg", map[string]string{"wrong-key": "x"})
	waitCondition(t, store, lethev1.MemoryStorePostgresReady, metav1.ConditionFalse, lethev1.ReasonSecretKeyMissing)
}

func TestSecretInAnotherNamespaceIsNotUsed(t *testing.T) {
	ctx := context.Background()
	other := newNamespace(t, "other")
	createSecret(t, other, "pg", map[string]string{"dsn": migratedDatabase(t)})
	ns := newNamespace(t, "mine")
	store := newStore(ns, nil)
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStorePostgresReady, metav1.ConditionFalse, lethev1.ReasonSecretNotFound)
}

func TestUnreachableLayersAreReported(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "down")
	deadPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	createSecret(t, ns, "pg", map[string]string{"dsn": fmt.Sprintf("postgres://lethe:pw-not-shown@127.0.0.1:%d/memory?sslmode=disable&connect_timeout=1", deadPort)})
	createSecret(t, ns, "falkor", map[string]string{"url": fmt.Sprintf("falkor://:pw-not-shown@127.0.0.1:%d", deadPort)})
	store := newStore(ns, func(s *lethev1.MemoryStore) {
		s.Spec.FalkorDB = &lethev1.FalkorDBSpec{URLSecretRef: lethev1.SecretKeyRef{Name: "falkor", Key: "url"}}
	})
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	pgCond := waitCondition(t, store, lethev1.MemoryStorePostgresReady, metav1.ConditionFalse, lethev1.ReasonConnectionFailed)
	graphCond := waitCondition(t, store, lethev1.MemoryStoreGraphReady, metav1.ConditionFalse, lethev1.ReasonConnectionFailed)
	for _, c := range []*metav1.Condition{pgCond, graphCond} {
		if strings.Contains(c.Message, "pw-not-shown") {
			t.Errorf("a condition message leaks a password: %q", c.Message)
		}
	}
	ready := waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionFalse, lethev1.ReasonNotReady)
	if !strings.Contains(ready.Message, "PostgresReady") || !strings.Contains(ready.Message, "GraphReady") {
		t.Errorf("Ready message does not name what is not ready: %q", ready.Message)
	}
	// No audit checked its erasures: LetheStoreAuditOverdue must see no check.
	if v := gaugeValue(t, "lethe_memorystore_last_audit_timestamp_seconds", "namespace", ns); v != -1 {
		t.Errorf("lethe_memorystore_last_audit_timestamp_seconds = %v for a store whose database never answered, want no series", v)
	}
}

// ownCluster is a control plane and a manager of a test's own, with the
// receipt signing key in place.
type ownCluster struct {
	cp          *testenv.ControlPlane
	c           client.Client
	stopManager func() error
	once        sync.Once
}

// startOwnCluster starts them; they stop when the test ends, or at stop.
func startOwnCluster(t *testing.T, opts ...func(*controllers.ErasureRequestReconciler)) *ownCluster {
	t.Helper()
	own := &ownCluster{}
	var err error
	if own.cp, err = testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{CRDDirs: cp.Env.CRDDirectoryPaths}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := own.stop(); err != nil {
			t.Errorf("stop the own cluster: %v", err)
		}
	})
	if own.c, err = client.New(own.cp.Config, client.Options{Scheme: suiteScheme()}); err != nil {
		t.Fatal(err)
	}
	if err := createReceiptKeyIn(context.Background(), own.c); err != nil {
		t.Fatal(err)
	}
	pools := &postgres.Pools{Options: postgres.Options{Vector: true}}
	t.Cleanup(pools.Close)
	if own.stopManager, err = startManager(own.cp.Config, pools, true, opts...); err != nil {
		t.Fatal(err)
	}
	return own
}

// stop stops the manager, then the API server, once.
func (o *ownCluster) stop() error {
	var err error
	o.once.Do(func() {
		if o.stopManager != nil {
			err = o.stopManager()
		}
		err = errors.Join(err, o.cp.Stop())
	})
	return err
}

// RedactionCompliant follows the reasoning column: True as migrated; False
// naming the column once its trigger is disabled; False with the counts of
// what the sample holds once it is back but rows were written without it.
// The message never holds a value.
func TestRedactionCompliantFollowsTheTriggerAndTheSample(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "redaction")
	dsn := migratedDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	createSecret(t, ns, "pg", map[string]string{"dsn": dsn})
	store := newStore(ns, nil)
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStoreRedactionCompliant, metav1.ConditionTrue, lethev1.ReasonRedacted)

	const leaked = "grace@example.net"
	if _, err := conn.Exec(ctx, `ALTER TABLE memory.rounds DISABLE TRIGGER lethe_redact_assistant_thinking;
		INSERT INTO memory.sessions (id, tenant_id, summary) VALUES ('00000000-0000-4000-8000-00000000aaaa', 't', 's');
		INSERT INTO memory.rounds (session_id, round_index, user_text, assistant_thinking)
			VALUES ('00000000-0000-4000-8000-00000000aaaa', 0, 'q', 'write to `+leaked+` tomorrow')`); err != nil {
		t.Fatal(err)
	}
	c := waitCondition(t, store, lethev1.MemoryStoreRedactionCompliant, metav1.ConditionFalse, lethev1.ReasonRedactionTriggerMissing)
	if !strings.Contains(c.Message, "memory.rounds.assistant_thinking") || !strings.Contains(c.Message, "1 email") || strings.Contains(c.Message, leaked) {
		t.Errorf("RedactionCompliant message %q: want the column and 1 email named, and no value", c.Message)
	}
	waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)

	if _, err := conn.Exec(ctx, `ALTER TABLE memory.rounds ENABLE ALWAYS TRIGGER lethe_redact_assistant_thinking`); err != nil {
		t.Fatal(err)
	}
	c = waitCondition(t, store, lethev1.MemoryStoreRedactionCompliant, metav1.ConditionFalse, lethev1.ReasonUnredactedValuesFound)
	if strings.Contains(c.Message, leaked) {
		t.Errorf("RedactionCompliant message holds the value: %q", c.Message)
	}
}

// kubectl erasure redact: a dry run counts what rows written before the
// trigger hold and changes nothing; the run redacts them, after which the
// store's RedactionCompliant is True again; bad flags are refused before
// anything is read.
func TestKubectlErasureRedact(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "redact")
	const leaked = "ken@example.com"
	if _, err := e.conn.Exec(ctx, `ALTER TABLE memory.rounds DISABLE TRIGGER lethe_redact_assistant_thinking;
		UPDATE memory.rounds SET assistant_thinking = 'reply to `+leaked+` or call +44 20 7946 0958';
		ALTER TABLE memory.rounds ENABLE ALWAYS TRIGGER lethe_redact_assistant_thinking`); err != nil {
		t.Fatal(err)
	}
	rows := countRows(t, e.conn, `SELECT count(*) FROM memory.rounds`)
	waitCondition(t, e.store, lethev1.MemoryStoreRedactionCompliant, metav1.ConditionFalse, lethev1.ReasonUnredactedValuesFound)

	if _, err := kubectlErasure(t, e.ns, "redact", "--store", e.store.Name, "--pages", "0"); err == nil {
		t.Fatal("--pages 0 accepted")
	}
	out, err := kubectlErasure(t, e.ns, "redact", "--store", e.store.Name, "--dry-run")
	if err != nil {
		t.Fatalf("redact --dry-run: %v\n%s", err, out)
	}
	want := fmt.Sprintf("%d email, %d phone", rows, rows)
	if !strings.Contains(out, want) || !strings.Contains(out, "nothing was changed") || strings.Contains(out, leaked) {
		t.Fatalf("redact --dry-run printed:\n%s\nwant %q, and no value", out, want)
	}
	if n := countRows(t, e.conn, `SELECT count(*) FROM memory.rounds WHERE strpos(assistant_thinking, $1) > 0`, leaked); n != rows {
		t.Fatalf("the dry run changed %d of %d rows", rows-n, rows)
	}
	if out, err = kubectlErasure(t, e.ns, "redact", "--store", e.store.Name); err != nil || !strings.Contains(out, want) {
		t.Fatalf("redact: %v\n%s", err, out)
	}
	if n := countRows(t, e.conn, `SELECT count(*) FROM memory.rounds WHERE strpos(assistant_thinking, $1) > 0`, leaked); n != 0 {
		t.Fatalf("%d rows still hold the value after redact", n)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreRedactionCompliant, metav1.ConditionTrue, lethev1.ReasonRedacted)
}

// countRows runs a count query.
func countRows(t *testing.T, conn *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
