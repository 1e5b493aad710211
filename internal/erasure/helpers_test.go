package erasure

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// The shared fixtures of the step tests: a request at each stage of the
// pipeline, a store with or without its graph and Velero sections, strict
// fakes that log every call, and the runner of a table of cases.

var (
	// now is the manager's (fake) clock. Its fraction of a second shows
	// where a time is truncated.
	now = time.Date(2030, 1, 10, 12, 0, 0, 700_000_000, time.UTC)
	// dbNow is the database's clock, an hour behind the manager's: a step
	// that reads the wrong clock gives a different answer.
	dbNow = time.Date(2030, 1, 10, 11, 0, 0, 250_000_000, time.UTC)
	// before is when the fixtures' earlier milestones happened.
	before = time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC)

	// errPort is a port's error. Its text must never reach a condition.
	errPort = errors.New("dial tcp 10.0.0.7:5432: connect: connection refused")
	// errConfig is what stands in the way when a human must fix the configuration.
	errConfig = &ConfigError{Reason: lethev1.ReasonSecretNotFound, Message: "Secret tenant-a/memory-dsn not found"}
	// errAny, as a case's wanted error, takes any error.
	errAny = errors.New("test: any error")
	// errUnexpected is what a strict fake returns for a call it did not expect.
	errUnexpected = errors.New("test: unexpected call")
)

const (
	uid        = "req-uid"
	generation = 3
)

var testConfig = Config{
	BatchSize: 50, ProbeBudget: 8, GraphBatch: 2, GraphDeleteLimit: 100, GraphTimeout: time.Minute,
	RetryAfter: 30 * time.Second, BackupRecheck: time.Hour, ReverifyInterval: 6 * time.Hour, ReplicaRecheck: 5 * time.Second,
}

// secs is a time as the API stores it: whole seconds, UTC.
func secs(t time.Time) *metav1.Time {
	m := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &m
}

func ptr[T any](v T) *T { return &v }

// newRequest is a request for three sessions with the default grace period
// that no step has touched yet.
func newRequest(mods ...func(*lethev1.ErasureRequest)) *lethev1.ErasureRequest {
	er := &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "erase-alice", Namespace: "tenant-a", UID: uid, Generation: generation},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"},
			SessionIDs: []lethev1.SessionID{"s1", "s2", "s3"}, GracePeriod: &metav1.Duration{Duration: 168 * time.Hour}},
	}
	for _, m := range mods {
		m(er)
	}
	return er
}

// stepReasons are the reasons of the completed steps of the fixtures.
var stepReasons = map[string]string{
	lethev1.ConditionTombstoned:         lethev1.ReasonSessionsTombstoned,
	lethev1.ConditionGracePeriodElapsed: lethev1.ReasonGraceElapsed,
	lethev1.ConditionDeleted:            lethev1.ReasonSessionsDeleted,
	lethev1.ConditionGraphReconciled:    lethev1.ReasonGraphPruned,
	lethev1.ConditionBackupsRotated:     lethev1.ReasonBackupsGone,
}

// reached is a request whose first n steps are done: their conditions
// True, one history entry each, the phase of the last, and the plan.
func reached(n int, mods ...func(*lethev1.ErasureRequest)) *lethev1.ErasureRequest {
	er := newRequest()
	st := &er.Status
	for i, ct := range stepConditions[:n] {
		st.Conditions = append(st.Conditions, metav1.Condition{Type: ct, Status: metav1.ConditionTrue, Reason: stepReasons[ct],
			Message: "done", ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(before)})
		st.History = evidence.Append(st.History, milestoneOf[ct], "", before.Add(time.Duration(i)*time.Hour), "sha256:fixture")
		st.Phase = milestoneOf[ct]
	}
	if n > 0 {
		st.Plan = &lethev1.ErasurePlan{SessionsFound: 3, Embeddings: 12, PlannedAt: secs(before)}
	}
	for _, m := range mods {
		m(er)
	}
	return er
}

// Stages of a request: the step each test runs is the next one.
func atTombstone() *lethev1.ErasureRequest { return reached(0) }
func atGrace() *lethev1.ErasureRequest     { return reached(1) }
func atDeletion() *lethev1.ErasureRequest  { return reached(2) }
func atGraph() *lethev1.ErasureRequest     { return reached(3) }
func atBackups() *lethev1.ErasureRequest   { return reached(4) }
func completed() *lethev1.ErasureRequest   { return reached(5) }

func dryRun(er *lethev1.ErasureRequest)    { er.Spec.DryRun = true }
func cancelled(er *lethev1.ErasureRequest) { er.Spec.Cancel = true }
func immediate(er *lethev1.ErasureRequest) {
	er.Spec.Immediate, er.Spec.Reason = true, "statutory deadline in three days"
}

// withStatusCondition sets (or replaces) a step condition of the fixture.
func withStatusCondition(ct string, ok bool, reason string) func(*lethev1.ErasureRequest) {
	return func(er *lethev1.ErasureRequest) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		c := metav1.Condition{Type: ct, Status: status, Reason: reason, Message: "fixture",
			ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(before)}
		for i := range er.Status.Conditions {
			if er.Status.Conditions[i].Type == ct {
				er.Status.Conditions[i] = c
				return
			}
		}
		er.Status.Conditions = append(er.Status.Conditions, c)
	}
}

// withStepEvidence puts one step's evidence in the fixture's status.
func withStepEvidence(ev lethev1.StepEvidence) func(*lethev1.ErasureRequest) {
	return func(er *lethev1.ErasureRequest) {
		if er.Status.Evidence == nil {
			er.Status.Evidence = &lethev1.ErasureEvidence{}
		}
		er.Status.Evidence.Steps = append(er.Status.Evidence.Steps, ev)
	}
}

// newStore is a SchemaCompliant store; graph and velero add its sections.
func newStore(mods ...func(*lethev1.MemoryStore)) *lethev1.MemoryStore {
	s := &lethev1.MemoryStore{
		ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: "tenant-a"},
		Spec:       lethev1.MemoryStoreSpec{TenantID: "acme"},
		Status: lethev1.MemoryStoreStatus{Conditions: []metav1.Condition{{Type: lethev1.MemoryStoreSchemaCompliant,
			Status: metav1.ConditionTrue, Reason: "Compliant", LastTransitionTime: metav1.NewTime(before)}}},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func withGraph(s *lethev1.MemoryStore) {
	s.Spec.FalkorDB = &lethev1.FalkorDBSpec{URLSecretRef: lethev1.SecretKeyRef{Name: "falkor", Key: "url"}, Graph: "memory"}
}

func withVelero(s *lethev1.MemoryStore) {
	s.Spec.Velero = &lethev1.VeleroSpec{Namespace: "velero-ns",
		BackupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "memory"}},
		RotationWindow: &metav1.Duration{Duration: 24 * time.Hour}}
}

func notCompliant(s *lethev1.MemoryStore) {
	s.Status.Conditions[0].Status, s.Status.Conditions[0].Reason = metav1.ConditionFalse, "NoCascade"
}

// fakes are the ports of one case. A nil function fails the test when it
// is called; graph and backups nil leave the port out (not configured).
type fakes struct {
	ledger   LedgerFns
	graph    *GraphFns
	backups  *BackupsFns
	replicas ReplicasFn
	claims   ClaimsFns
	// wrapLedger, when set, wraps the ledger's fakes (a method they cannot fake).
	wrapLedger func(Ledger) Ledger
}

// callLog is the calls the ports received, in order, as "Port.Method(args)".
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(call string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, call)
}

func (l *callLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

// wire returns the ports of the fakes, every call logged, and the log.
func (f fakes) wire(t *testing.T) (Ports, *callLog) {
	log := &callLog{}
	l, c, r := f.ledger, f.claims, struct{ CaughtUpFn ReplicasFn }{f.replicas}
	strict(t, log, "Ledger", &l)
	strict(t, log, "Claims", &c)
	strict(t, log, "Replicas", &r)
	p := Ports{Ledger: &l, Claims: &c, Replicas: r.CaughtUpFn, Clock: testingclock.NewFakePassiveClock(now)}
	if f.wrapLedger != nil {
		p.Ledger = f.wrapLedger(&l)
	}
	if f.graph != nil {
		g := *f.graph
		strict(t, log, "Graph", &g)
		p.Graph = &g
	}
	if f.backups != nil {
		b := *f.backups
		strict(t, log, "Backups", &b)
		p.Backups = &b
	}
	return p, log
}

var (
	ctxType   = reflect.TypeFor[context.Context]()
	errorType = reflect.TypeFor[error]()
)

// strict wraps every function field of the struct fns points to: the call
// is logged, and a field left nil fails the test (and returns errUnexpected).
func strict(t *testing.T, log *callLog, port string, fns any) {
	v := reflect.ValueOf(fns).Elem()
	for i := range v.NumField() {
		field, name := v.Field(i), port+"."+strings.TrimSuffix(v.Type().Field(i).Name, "Fn")
		fn, ft := reflect.ValueOf(field.Interface()), field.Type()
		field.Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
			var shown []string
			for j, a := range args {
				if ft.In(j) != ctxType {
					shown = append(shown, render(a.Interface()))
				}
			}
			log.add(name + "(" + strings.Join(shown, ", ") + ")")
			if fn.IsNil() {
				t.Errorf("unexpected call %s", name)
				out := make([]reflect.Value, ft.NumOut())
				for k := range out {
					out[k] = reflect.New(ft.Out(k)).Elem()
					if ft.Out(k) == errorType {
						out[k].Set(reflect.ValueOf(errUnexpected))
					}
				}
				return out
			}
			return fn.Call(args)
		}))
	}
}

// apiDefaultClockSkew is left out of the call log.
const apiDefaultClockSkew = lethev1.DefaultClockSkew

// render shows an argument in the call log.
func render(v any) string {
	switch x := v.(type) {
	case Request:
		return fmt.Sprintf("{%s %v grace=%s}", x.UID, x.SessionIDs, x.Grace)
	case ContentKeys:
		if x == nil {
			return "no content keys"
		}
		return fmt.Sprintf("%d content keys", len(x))
	case metav1.Condition:
		return fmt.Sprintf("%s=%s/%s", x.Type, x.Status, x.Reason)
	case BackupScope:
		out := x.Namespace + " " + x.Selector.String()
		if x.DeleteOnImmediate {
			out += " deleteOnImmediate"
		}
		if x.MinRetention > 0 {
			out += " minRetention=" + x.MinRetention.String()
		}
		if x.ClockSkew != apiDefaultClockSkew {
			out += " clockSkew=" + x.ClockSkew.String()
		}
		return out
	case BackupRequest:
		return fmt.Sprintf("{%s %s/%s immediate=%t deletedAt=%s window=%s}", x.UID, x.Namespace, x.Name, x.Immediate,
			x.DeletedAt.Format(time.RFC3339Nano), x.Window)
	default:
		return fmt.Sprint(v)
	}
}

// stepFn runs one step (Run or Reverify).
type stepFn func(context.Context, *Scope) Outcome

// stepCase is one case of a step's table.
type stepCase struct {
	reason string
	er     *lethev1.ErasureRequest
	store  *lethev1.MemoryStore
	fakes  fakes
	want   stepWant
}

type stepWant struct {
	out Outcome
	// err is what Err must match by errors.Is (errAny: any error); nil: Err must be nil.
	err error
	// status is what Record made of the outcome.
	status recorded
	// calls the ports received, in order.
	calls []string
}

// recorded is the part of a request's status that Record writes.
type recorded struct {
	Conditions  []metav1.Condition
	Plan        *lethev1.ErasurePlan
	GraceEndsAt *metav1.Time
	Evidence    []lethev1.StepEvidence
	History     int
	Last        head
}

// head is the last history entry's phase, event and time.
type head struct {
	Phase lethev1.Phase
	Event string
	Time  time.Time
}

func recordedOf(er *lethev1.ErasureRequest) recorded {
	st := er.Status.DeepCopy()
	r := recorded{Conditions: st.Conditions, Plan: st.Plan, GraceEndsAt: st.GraceEndsAt, History: len(st.History)}
	if st.Evidence != nil {
		r.Evidence = st.Evidence.Steps
	}
	if n := len(st.History); n > 0 {
		h := st.History[n-1]
		r.Last = head{Phase: h.Phase, Event: h.Event, Time: h.Time.Time}
	}
	return r
}

// after is the fixture's status with the given changes.
func after(er *lethev1.ErasureRequest, edits ...func(*recorded)) recorded {
	r := recordedOf(er)
	for _, e := range edits {
		e(&r)
	}
	return r
}

// withCond sets (or replaces) the step condition c, as Record writes it.
func withCond(c *Condition) func(*recorded) {
	return func(r *recorded) {
		status := metav1.ConditionFalse
		if c.OK {
			status = metav1.ConditionTrue
		}
		mc := metav1.Condition{Type: c.Type, Status: status, Reason: c.Reason, Message: c.Message, ObservedGeneration: generation}
		for i := range r.Conditions {
			if r.Conditions[i].Type == c.Type {
				r.Conditions[i] = mc
				return
			}
		}
		r.Conditions = append(r.Conditions, mc)
	}
}

func withPlan(p *lethev1.ErasurePlan) func(*recorded) { return func(r *recorded) { r.Plan = p } }

func withGraceEndsAt(t time.Time) func(*recorded) {
	return func(r *recorded) { r.GraceEndsAt = secs(t) }
}

// withEvidence replaces the evidence of ev's step, or appends it.
func withEvidence(ev lethev1.StepEvidence) func(*recorded) {
	return func(r *recorded) {
		for i := range r.Evidence {
			if r.Evidence[i].Step == ev.Step {
				r.Evidence[i] = ev
				return
			}
		}
		r.Evidence = append(r.Evidence, ev)
	}
}

// withEntry appends a history entry.
func withEntry(phase lethev1.Phase, event string, at time.Time) func(*recorded) {
	return func(r *recorded) {
		r.History++
		r.Last = head{Phase: phase, Event: event, Time: at.UTC().Truncate(time.Second)}
	}
}

var (
	outcomeOpts = cmp.Options{cmpopts.IgnoreFields(Outcome{}, "Err"), cmpopts.EquateEmpty(), persistedSet}
	// persistedSet compares Outcome.Persisted by whether it is set.
	persistedSet = cmp.Comparer(func(a, b func()) bool { return (a == nil) == (b == nil) })
	statusOpts   = cmp.Options{cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime"), cmpopts.EquateEmpty()}
)

// runCases runs each case's step on its fixtures and checks the outcome,
// its error, the status Record makes of it and the calls the ports got.
func runCases(t *testing.T, run stepFn, cases map[string]stepCase) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, er, calls := runCase(t, run, tc)
			if diff := cmp.Diff(tc.want.out, got, outcomeOpts); diff != "" {
				t.Errorf("%s\noutcome: -want, +got:\n%s", tc.reason, diff)
			}
			switch {
			case errors.Is(tc.want.err, errAny):
				if got.Err == nil {
					t.Errorf("%s\nErr: got nil, want an error", tc.reason)
				}
			case !errors.Is(got.Err, tc.want.err):
				t.Errorf("%s\nErr: got %v, want errors.Is %v", tc.reason, got.Err, tc.want.err)
			}
			if diff := cmp.Diff(tc.want.status, recordedOf(er), statusOpts); diff != "" {
				t.Errorf("%s\nstatus after Record: -want, +got:\n%s", tc.reason, diff)
			}
			if diff := cmp.Diff(tc.want.calls, calls, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s\ncalls: -want, +got:\n%s", tc.reason, diff)
			}
			checkInvariants(t, got, er)
		})
	}
}

// runCase runs the step once on a copy of the case's request, checks it
// only read the request, records the outcome and returns it all.
func runCase(t *testing.T, run stepFn, tc stepCase) (Outcome, *lethev1.ErasureRequest, []string) {
	t.Helper()
	ports, log := tc.fakes.wire(t)
	er, store := tc.er.DeepCopy(), tc.store
	if store == nil {
		store = newStore()
	}
	got := run(context.Background(), &Scope{Request: er, Store: store, Ports: ports})
	if diff := cmp.Diff(tc.er, er); diff != "" {
		t.Errorf("%s\nthe step changed the request it may only read: -before, +after:\n%s", tc.reason, diff)
	}
	Record(er, got, now, nil)
	return got, er, log.list()
}

// checkInvariants are what every outcome of every step must keep.
func checkInvariants(t *testing.T, out Outcome, er *lethev1.ErasureRequest) {
	t.Helper()
	if (out.Kind == Errored) != (out.Err != nil) {
		t.Errorf("kind %d with Err %v: an error goes with Errored, and only with it", out.Kind, out.Err)
	}
	if out.Err != nil {
		for _, c := range er.Status.Conditions {
			if strings.Contains(c.Message, out.Err.Error()) {
				t.Errorf("condition %s carries the error's text: %q", c.Type, c.Message)
			}
		}
	}
	if (out.Kind == Waiting || out.Kind == Stalled) && out.RequeueAfter <= 0 && out.Wake == nil {
		t.Errorf("kind %d with RequeueAfter %s and no wake: a request that waits must be looked at again", out.Kind, out.RequeueAfter)
	}
	if out.Kind == Stalled && (out.Condition == nil || !stalledReasons[out.Condition.Reason]) {
		t.Errorf("Stalled with condition %+v: its reason is not in stalledReasons", out.Condition)
	}
	if c := out.Condition; c != nil && (c.Reason == "" || c.Message == "") {
		t.Errorf("condition %s without a reason or message: %+v", c.Type, c)
	}
}
