package controllers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	pgxvec "github.com/pgvector/pgvector-go/pgx"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// memoryEnv is one namespace with a MemoryStore (Postgres only, tenant t1)
// over a fresh, migrated database seeded with sessions.
type memoryEnv struct {
	ns    string
	dsn   string
	conn  *pgx.Conn
	store *lethev1.MemoryStore
}

const (
	erasedA  = "11111111-1111-4111-8111-11111111111a"
	erasedA2 = "11111111-1111-4111-8111-11111111111c"
	keptB    = "11111111-1111-4111-8111-11111111111b"
	otherT2  = "22222222-2222-4222-8222-22222222222d" // tenant t2
	marker   = "PERSONAL-DATA-MARKER-7f3a"            // content that must never leave the database
)

func newMemoryEnv(t *testing.T, prefix string) *memoryEnv {
	t.Helper()
	return newMemoryEnvWith(t, prefix, nil, nil)
}

// newMemoryEnvWith runs setup after seeding and before the store exists,
// and mutate on the store before it is created.
func newMemoryEnvWith(t *testing.T, prefix string, setup func(*memoryEnv), mutate func(*lethev1.MemoryStore)) *memoryEnv {
	t.Helper()
	ctx := context.Background()
	e := &memoryEnv{ns: newNamespace(t, prefix), dsn: migratedDatabase(t)}
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgxvec.RegisterTypes(ctx, conn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	e.conn = conn
	for i, s := range []fixture.Session{
		{ID: erasedA, Tenant: "t1", Rounds: 3, Text: marker + " alice"},
		{ID: erasedA2, Tenant: "t1", Rounds: 2, Text: marker + " alice again"},
		{ID: keptB, Tenant: "t1", Rounds: 3, Text: "bob"},
		{ID: otherT2, Tenant: "t2", Rounds: 3, Text: "carol"},
	} {
		s.Seed = i + 1
		if err := fixture.Seed(ctx, conn, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := fixture.DeriveProfile(ctx, conn, "t1", "project of alice and bob", erasedA, keptB); err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(e)
	}
	createSecret(t, e.ns, "pg", map[string]string{"dsn": e.dsn})
	e.store = newStore(e.ns, func(s *lethev1.MemoryStore) {
		s.Spec.TenantID = "t1"
		if mutate != nil {
			mutate(s)
		}
	})
	if err := k8s.Create(ctx, e.store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)
	return e
}

func (e *memoryEnv) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// sessionRows counts a session's rows across every reference table.
func (e *memoryEnv) sessionRows(t *testing.T, id string) int64 {
	t.Helper()
	var n int64
	for _, table := range []string{"rounds", "facts", "fact_corrections", "artifacts", "file_snapshots", "backfill_progress"} {
		n += e.count(t, `SELECT count(*) FROM memory.`+table+` WHERE session_id = $1`, id)
	}
	return n + e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = $1`, id)
}

func (e *memoryEnv) request(t *testing.T, name string, mutate func(*lethev1.ErasureRequest)) *lethev1.ErasureRequest {
	t.Helper()
	er := &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: lethev1.ErasureRequestSpec{
			StoreRef:   lethev1.StoreReference{Name: e.store.Name},
			SessionIDs: []lethev1.SessionID{erasedA, erasedA2},
			Immediate:  true, Reason: "ticket DPO-1",
		},
	}
	if mutate != nil {
		mutate(er)
	}
	if err := k8s.Create(context.Background(), er); err != nil {
		t.Fatal(err)
	}
	return er
}

func waitPhase(t *testing.T, er *lethev1.ErasureRequest, phase lethev1.Phase) {
	t.Helper()
	waitPhaseIn(t, k8s, er, phase)
}

// waitPhaseIn is waitPhase against the API server of c.
func waitPhaseIn(t *testing.T, c client.Client, er *lethev1.ErasureRequest, phase lethev1.Phase) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if er.Status.Phase != phase {
			return fmt.Errorf("phase %q, want %q; conditions %s", er.Status.Phase, phase, conditionsString(er.Status.Conditions))
		}
		return nil
	})
}

func conditionsString(cs []metav1.Condition) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s/%s(%s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, " ")
}

// waitHistoryEntry waits until er's history has an entry "Phase[/Event]".
func waitHistoryEntry(t *testing.T, er *lethev1.ErasureRequest, entry string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if !slices.Contains(historyPhases(er), entry) {
			return fmt.Errorf("history %v has no %s", historyPhases(er), entry)
		}
		return nil
	})
}

func historyPhases(er *lethev1.ErasureRequest) []string {
	var out []string
	for _, h := range er.Status.History {
		p := string(h.Phase)
		if h.Event != "" {
			p += "/" + h.Event
		}
		out = append(out, p)
	}
	return out
}

func TestImmediateRequestErasesEveryLayerAndOnlyThat(t *testing.T) {
	e := newMemoryEnv(t, "immediate")
	keptBefore := e.sessionRows(t, keptB)
	otherBefore := e.sessionRows(t, otherT2)
	er := e.request(t, "forget-1", func(r *lethev1.ErasureRequest) {
		r.Spec.SessionIDs = append(r.Spec.SessionIDs, otherT2) // another tenant's session: never touched
	})
	waitPhase(t, er, lethev1.PhaseBackupsRotated)

	for _, id := range []string{erasedA, erasedA2} {
		if n := e.sessionRows(t, id); n != 0 {
			t.Errorf("%d rows of erased session %s remain", n, id)
		}
	}
	if n := e.sessionRows(t, keptB); n != keptBefore {
		t.Errorf("kept session: %d rows, want %d", n, keptBefore)
	}
	if n := e.sessionRows(t, otherT2); n != otherBefore {
		t.Errorf("other tenant's session: %d rows, want %d (S2)", n, otherBefore)
	}
	if n := e.count(t, `SELECT count(*) FROM memory_derived.embedding_cache WHERE text LIKE '%'||$1||'%'`, marker); n != 0 {
		t.Errorf("%d content-keyed cache entries of erased content remain", n)
	}
	if n := e.count(t, `SELECT count(*) FROM memory_derived.profiles WHERE summary LIKE '%alice%'`); n != 0 {
		t.Errorf("%d derived profiles of erased sessions remain", n)
	}
	if n := e.count(t, `SELECT count(*) FROM memory_derived.profiles WHERE summary = 'digest: bob'`); n != 1 {
		t.Errorf("the kept session's own profile is gone")
	}
	// Receipts: exactly one per step and batch (batch size 2: one delete batch for 2 sessions).
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1`, string(er.UID)); n != 2 {
		t.Errorf("receipts: %d, want 2 (Tombstoned, Deleted batch 0)", n)
	}

	plan := er.Status.Plan
	if plan == nil || plan.SessionsFound != 2 || !slices.Equal(plan.NotFoundSessionIDs, []lethev1.SessionID{otherT2}) {
		t.Fatalf("plan = %+v, want 2 found and the other tenant's session not found", plan)
	}
	want := []string{"Tombstoned", "GracePeriod/Immediate", "Deleted", "GraphReconciled/NotConfigured", "BackupsRotated/NotConfigured"}
	if got := historyPhases(er); !slices.Equal(got, want) {
		t.Errorf("history %v, want %v", got, want)
	}
	if err := evidence.VerifyChain(evidence.ChainOf(er)); err != nil || er.Status.EvidenceFormat != evidence.Format {
		t.Errorf("history chain (format %q): %v", er.Status.EvidenceFormat, err)
	}
	// The last entry digests the request's evidence as it stands.
	last := er.Status.History[len(er.Status.History)-1]
	if d, err := evidence.CanonicalDigest(evidence.DocumentFor(er, last.EvidenceParts, "")); err != nil || d != last.EvidenceDigest ||
		!maps.Equal(evidence.PartsOf(er), last.EvidenceParts) {
		t.Errorf("the last entry's evidence digest %s and parts do not cover the evidence as it stands: %v", d, err)
	}
	if er.Status.Deadline == nil || !er.Status.Deadline.Time.Equal(er.CreationTimestamp.AddDate(0, 1, 0)) {
		t.Errorf("deadline %v, want one month after creation %v", er.Status.Deadline, er.CreationTimestamp)
	}
	ready := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != lethev1.ReasonCompleted {
		t.Errorf("Ready = %+v", ready)
	}
	assertNoPersonalData(t, er)
	assertSignedReceipt(t, er)
}

// assertNoPersonalData greps the status, the events and the manager's logs
// for the seeded content (target S4).
func assertNoPersonalData(t *testing.T, er *lethev1.ErasureRequest) {
	t.Helper()
	status, err := json.Marshal(er.Status)
	if err != nil {
		t.Fatal(err)
	}
	// Events are written asynchronously (an immediate request's only one
	// is its receipt's, from the pass that completed it).
	evs := &eventsv1.EventList{}
	eventually(t, 10*time.Second, func() error {
		if err := k8s.List(context.Background(), evs, client.InNamespace(er.Namespace)); err != nil {
			return err
		}
		if len(evs.Items) == 0 {
			return errors.New("no events recorded: the grep would prove nothing")
		}
		return nil
	})
	evText, _ := json.Marshal(evs.Items)
	// spec.reason is free text a person typed: it stays in the spec.
	needles := []string{marker, "alice"}
	if er.Spec.Reason != "" {
		needles = append(needles, er.Spec.Reason)
	}
	for what, text := range map[string]string{"status": string(status), "events": string(evText), "manager logs": managerLogs.String()} {
		for _, needle := range needles {
			if strings.Contains(text, needle) {
				t.Errorf("%s contain personal data %q", what, needle)
			}
		}
	}
}

func TestGracePeriodLastsByTheDatabaseClockAndCancelLiftsTheTombstone(t *testing.T) {
	e := newMemoryEnv(t, "grace")
	before := e.sessionRows(t, erasedA)
	er := e.request(t, "forget-later", func(r *lethev1.ErasureRequest) {
		r.Spec.Immediate, r.Spec.Reason = false, ""
		r.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
	})
	waitPhase(t, er, lethev1.PhaseTombstoned)
	// The operator's clock is 8 days ahead; the database's says an hour remains (R6).
	c := waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	if c.Status != metav1.ConditionFalse || er.Status.GraceEndsAt == nil {
		t.Fatalf("grace = %+v, graceEndsAt %v", c, er.Status.GraceEndsAt)
	}
	// Tombstoned sessions are hidden from the application role at once.
	if n := e.appVisible(t, erasedA); n != 0 {
		t.Errorf("application role sees %d rows of a tombstoned session", n)
	}

	patch := client.MergeFrom(er.DeepCopy())
	er.Spec.Cancel = true
	if err := k8s.Patch(context.Background(), er, patch); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseCancelled)
	if n := e.sessionRows(t, erasedA); n != before {
		t.Errorf("cancelled request: %d rows, want %d untouched", n, before)
	}
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
		t.Errorf("%d sessions still tombstoned after cancel", n)
	}
	if n := e.appVisible(t, erasedA); n == 0 {
		t.Error("the session is still hidden after cancel")
	}
	if got, want := historyPhases(er), []string{"Tombstoned", "Cancelled"}; !slices.Equal(got, want) {
		t.Errorf("history %v, want %v", got, want)
	}
	if err := evidence.VerifyChain(evidence.ChainOf(er)); err != nil {
		t.Error(err)
	}
}

// appVisible counts the session's rows the application role can read.
func (e *memoryEnv) appVisible(t *testing.T, id string) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL ROLE memory_app`); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM memory.sessions WHERE id = $1) + (SELECT count(*) FROM memory.rounds WHERE session_id = $1)`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitStepReason(t *testing.T, er *lethev1.ErasureRequest, condType, reason string) *metav1.Condition {
	t.Helper()
	return waitStepReasonIn(t, k8s, er, condType, reason)
}

// waitStepReasonIn is waitStepReason against the API server of c.
func waitStepReasonIn(t *testing.T, c client.Client, er *lethev1.ErasureRequest, condType, reason string) *metav1.Condition {
	t.Helper()
	var out *metav1.Condition
	eventually(t, 30*time.Second, func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		c := meta.FindStatusCondition(er.Status.Conditions, condType)
		if c == nil || c.Reason != reason {
			return fmt.Errorf("%s: %+v, want reason %s", condType, c, reason)
		}
		out = c
		return nil
	})
	return out
}

func TestShortGraceElapsesByTheDatabaseClock(t *testing.T) {
	e := newMemoryEnv(t, "shortgrace")
	er := e.request(t, "forget-soon", func(r *lethev1.ErasureRequest) {
		r.Spec.Immediate, r.Spec.Reason = false, ""
		r.Spec.GracePeriod = &metav1.Duration{Duration: 2 * time.Second}
	})
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if got, want := historyPhases(er), []string{"Tombstoned", "GracePeriod", "Deleted", "GraphReconciled/NotConfigured", "BackupsRotated/NotConfigured"}; !slices.Equal(got, want) {
		t.Errorf("history %v, want %v", got, want)
	}
	// The deletion happened after the grace end by the database clock.
	var deleted, graceEnd time.Time
	if err := e.conn.QueryRow(context.Background(), `SELECT min(erased_at), min(grace_ends_at) FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'session'`, string(er.UID)).Scan(&deleted, &graceEnd); err != nil {
		t.Fatal(err)
	}
	if deleted.Before(graceEnd) {
		t.Errorf("erased at %v, before the grace end %v", deleted, graceEnd)
	}
}

func TestDryRunPlansAndChangesNothing(t *testing.T) {
	e := newMemoryEnv(t, "dryrun")
	before := e.dump(t)
	er := e.request(t, "plan-only", func(r *lethev1.ErasureRequest) { r.Spec.DryRun = true })
	waitPhase(t, er, lethev1.PhasePlanned)
	if er.Status.Plan == nil || er.Status.Plan.SessionsFound != 2 || er.Status.Plan.Embeddings == 0 || er.Status.Plan.DerivedRecords != 3 {
		t.Fatalf("plan = %+v", er.Status.Plan)
	}
	after := e.dump(t)
	for table, d := range before {
		if after[table] != d {
			t.Errorf("dry run changed %s", table)
		}
	}
}

// dump digests every row of every table of the memory database.
func (e *memoryEnv) dump(t *testing.T) map[string]string {
	t.Helper()
	out, err := testenv.TableDigests(context.Background(), e.conn)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 {
		t.Fatalf("dump covers %d tables", len(out))
	}
	return out
}

func TestResurrectedSessionsAreErasedAgain(t *testing.T) {
	e := newMemoryEnv(t, "resurrect")
	er := e.request(t, "forget-then-restore", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	// A data-only restore of the memory tables from a pre-erasure backup
	// (pg_restore --data-only --disable-triggers: the erased-source guard does
	// not fire) brings the session back while the ledger stays.
	ctx := context.Background()
	if _, err := e.conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if err := fixture.Seed(ctx, e.conn, fixture.Session{ID: erasedA, Tenant: "t1", Rounds: 2, Text: marker, Seed: 1, NoProfile: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.conn.Exec(ctx, `RESET session_replication_role`); err != nil {
		t.Fatal(err)
	}
	// Hidden from the application at once: the ledger says erased.
	if n := e.appVisible(t, erasedA); n != 0 {
		t.Errorf("application role sees %d rows of a resurrected session", n)
	}
	eventually(t, 30*time.Second, func() error {
		if n := e.sessionRows(t, erasedA); n != 0 {
			return fmt.Errorf("%d rows of the resurrected session remain", n)
		}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if last := er.Status.History[len(er.Status.History)-1]; last.Event != lethev1.ReasonResurrected {
			return fmt.Errorf("last history entry %+v", last)
		}
		return nil
	})
	if err := evidence.VerifyChain(evidence.ChainOf(er)); err != nil {
		t.Error(err)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Resurrected'`, string(er.UID)); n != 1 {
		t.Errorf("resurrection receipts: %d, want 1", n)
	}
}

func TestResidueIsReportedWithItsTable(t *testing.T) {
	e := newMemoryEnv(t, "residue")
	// An export job copied one of the session's embeddings somewhere the cascade cannot reach.
	if _, err := e.conn.Exec(context.Background(), `CREATE TABLE public.analytics_vectors (id int, v vector(384));
		INSERT INTO public.analytics_vectors SELECT 1, embedding FROM memory.rounds WHERE session_id = '`+erasedA+`' LIMIT 1;
		GRANT SELECT ON public.analytics_vectors TO lethe_operator -- what an adopter grants so Lethe can probe it`); err != nil {
		t.Fatal(err)
	}
	er := e.request(t, "forget-with-residue", nil)
	c := waitStepReason(t, er, lethev1.ConditionDeleted, lethev1.ReasonResidueFound)
	if !strings.Contains(c.Message, "public.analytics_vectors.v") {
		t.Errorf("residue condition does not name the table: %q", c.Message)
	}
	stalled := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionStalled)
	if stalled == nil || stalled.Status != metav1.ConditionTrue {
		t.Errorf("Stalled = %+v, want True", stalled)
	}
	// A human removes the copy; the request completes.
	if _, err := e.conn.Exec(context.Background(), `DELETE FROM public.analytics_vectors`); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
}

// TestTextResidueIsReportedWithItsColumn: a verbatim copy of an erased
// round's text outside the cascade stalls the Deleted step with the
// column's name and never the text; a copy in a schema the store excludes
// does not, and the evidence counts it as excluded.
func TestTextResidueIsReportedWithItsColumn(t *testing.T) {
	long := marker + " alice told the assistant that her landlord in Bristol kept the deposit of her flat after she moved out in June and asked how to claim it back"
	e := newMemoryEnvWith(t, "textresidue", func(e *memoryEnv) {
		// An export job copied a round's text where the cascade cannot reach;
		// the adopter grants what Lethe needs to probe it.
		if _, err := e.conn.Exec(context.Background(), `UPDATE memory.rounds SET user_text = $2 WHERE session_id = $1`, erasedA, long); err != nil {
			t.Fatal(err)
		}
		if _, err := e.conn.Exec(context.Background(), `CREATE TABLE public.chat_exports (body text);
			CREATE SCHEMA legal_hold; CREATE TABLE legal_hold.copies (body text);
			GRANT SELECT ON public.chat_exports TO lethe_operator;
			GRANT USAGE ON SCHEMA legal_hold TO lethe_operator; GRANT SELECT ON legal_hold.copies TO lethe_operator`); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"public.chat_exports", "legal_hold.copies"} {
			if _, err := e.conn.Exec(context.Background(), `INSERT INTO `+table+` VALUES ($1)`, "exported: "+long); err != nil {
				t.Fatal(err)
			}
		}
	}, func(s *lethev1.MemoryStore) { s.Spec.Postgres.ResidueProbeExclude = []string{"legal_hold"} })
	er := e.request(t, "forget-with-text-residue", nil)
	c := waitStepReason(t, er, lethev1.ConditionDeleted, lethev1.ReasonResidueFound)
	if c.Message != "verbatim copies of erased text remain in public.chat_exports.body: remove them; Lethe probes again" {
		t.Errorf("residue condition %q: want it to name public.chat_exports.body alone", c.Message)
	}
	status, err := json.Marshal(er.Status)
	if err != nil {
		t.Fatal(err)
	}
	for _, needle := range []string{marker, "alice", "landlord"} {
		if strings.Contains(string(status), needle) {
			t.Errorf("the status holds the erased text (%q)", needle)
		}
	}
	// A human removes the copy; the request completes, the excluded copy counted, not probed.
	if _, err := e.conn.Exec(context.Background(), `DELETE FROM public.chat_exports`); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if note := stepEvidence(t, er, lethev1.ConditionDeleted).Note; !strings.Contains(note, "text probe: 1 passage(s)") || !strings.Contains(note, "1 excluded by the store") {
		t.Errorf("Deleted evidence note %q: want the one passage probed and the excluded column counted", note)
	}
}

func TestDeletingARequestDuringTheGracePeriodLiftsTheTombstone(t *testing.T) {
	e := newMemoryEnv(t, "withdraw")
	er := e.request(t, "typo", func(r *lethev1.ErasureRequest) {
		r.Spec.Immediate, r.Spec.Reason = false, ""
	})
	waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
	if err := k8s.Delete(context.Background(), er); err != nil {
		t.Fatal(err)
	}
	waitRequestGone(t, er)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
		t.Errorf("%d sessions still tombstoned after the request was deleted", n)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Cancelled'`, string(er.UID)); n != 1 {
		t.Errorf("withdrawal receipt: %d, want 1 (the database keeps the record)", n)
	}
}

// A request whose grace has passed but whose deletion was never claimed
// (here the store's schema stopped being compliant, so the Deleted step
// waits with StoreNotReady) is withdrawn when it is deleted: its tombstones
// are lifted, and nothing is erased once the schema is fixed.
func TestDeletingARequestBeforeItsClaimWithdrawsIt(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "withdraw-unclaimed")
	er := e.requestWaitingForACompliantSchema(t, "typo")
	sessions := e.count(t, `SELECT count(*) FROM memory.sessions`)
	if err := k8s.Delete(ctx, er); err != nil {
		t.Fatal(err)
	}
	waitRequestGone(t, er)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
		t.Errorf("%d sessions still tombstoned after the unclaimed request was deleted", n)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Cancelled'`, string(er.UID)); n != 1 {
		t.Errorf("withdrawal receipt: %d, want 1", n)
	}
	// The schema fixed, the store is ready for deletions again: the
	// withdrawn request's sessions stay.
	if _, err := e.conn.Exec(ctx, `DROP TABLE memory.session_notes`); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreSchemaCompliant, metav1.ConditionTrue, lethev1.ReasonCompliant)
	if n := e.count(t, `SELECT count(*) FROM memory.sessions`); n != sessions {
		t.Errorf("%d sessions after the schema was fixed, want the %d there before the withdrawal", n, sessions)
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND erased_at IS NOT NULL`, string(er.UID)); n != 0 {
		t.Errorf("%d ledger rows of the withdrawn request say erased", n)
	}
}

// waitRequestGone waits until er's object is gone (its finalizer released).
func waitRequestGone(t *testing.T, er *lethev1.ErasureRequest) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), &lethev1.ErasureRequest{})
		if err == nil {
			return fmt.Errorf("request still exists")
		}
		return client.IgnoreNotFound(err)
	})
}

// assertSignedReceipt checks the receipt with the public key the manager
// published, and that an altered history fails the check.
func assertSignedReceipt(t *testing.T, er *lethev1.ErasureRequest) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 10*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if er.Status.Receipt == nil || er.Status.Receipt.Envelope == "" || er.Status.Receipt.Log == nil {
			return fmt.Errorf("no signed receipt in the store's log: %+v", er.Status.Receipt)
		}
		return nil
	})
	ks := publishedKeySet(t)
	if _, err := evidence.VerifyRequest(ctx, er, evidence.Options{KeySet: ks}); err != nil {
		t.Fatalf("the request does not verify: %v", err)
	}
	for i, h := range er.Status.History {
		if h.Signature == "" || len(ks.Lookup(h.KeyID)) == 0 {
			t.Fatalf("history entry %d is not signed by a published key: %+v", i, h)
		}
	}
	tampered := er.DeepCopy()
	tampered.Status.History[0].Time = metav1.NewTime(tampered.Status.History[0].Time.Add(time.Hour))
	if _, err := evidence.VerifyRequest(ctx, tampered, evidence.Options{KeySet: ks}); err == nil {
		t.Fatal("a history with an edited entry verifies")
	}
}

// publishedKeySet reads the key set the manager publishes.
func publishedKeySet(t *testing.T) evidence.KeySet {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(context.Background(), receiptKeySecret, cm); err != nil {
		t.Fatalf("the key set is not published: %v", err)
	}
	ks, err := evidence.ParseKeySet([]byte(cm.Data[controllers.ReceiptKeySet]))
	if err != nil || len(ks.Keys) == 0 {
		t.Fatalf("the published key set: %v (%d keys)", err, len(ks.Keys))
	}
	return ks
}
