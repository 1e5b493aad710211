package erasure

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func runTombstoning(ctx context.Context, s *Scope) Outcome {
	return Tombstoning{Config: testConfig}.Run(ctx, s)
}

// foundPlan is what the database found of the request's three sessions.
func foundPlan() Plan {
	return Plan{Found: []string{"s1", "s2"}, NotFound: []string{"s3"},
		Rows:       []Count{{Table: "memory.sessions", Rows: 2}, {Table: "memory.messages", Rows: 40}},
		Embeddings: 12, ContentIndexEntries: 3, DerivedRecords: 1,
		TombstonedAt: dbNow, GraceEndsAt: dbNow.Add(168 * time.Hour), CommitLSN: "0/2000028"}
}

// foundPlanStatus is foundPlan in the API's shape.
func foundPlanStatus() *lethev1.ErasurePlan {
	return &lethev1.ErasurePlan{SessionsFound: 2, NotFoundSessionIDs: []lethev1.SessionID{"s3"},
		Rows:       []lethev1.TableCount{{Table: "memory.sessions", Rows: 2}, {Table: "memory.messages", Rows: 40}},
		Embeddings: 12, ContentIndexEntries: 3, DerivedRecords: 1, PlannedAt: secs(dbNow)}
}

func tombstoneReturns(p Plan, err error) LedgerFns {
	return LedgerFns{TombstoneFn: func(context.Context, Request) (Plan, error) { return p, err }}
}

// tombstoned is the Done outcome of a tombstone that found sessions.
func tombstoned(p Plan, ps *lethev1.ErasurePlan, reason, message, note string) Outcome {
	ev := &lethev1.StepEvidence{Step: lethev1.ConditionTombstoned, StartedAt: secs(p.TombstonedAt), CompletedAt: secs(p.TombstonedAt),
		Counts: ps.Rows, Note: note}
	return Outcome{Kind: Done, Condition: &Condition{Type: lethev1.ConditionTombstoned, OK: true, Reason: reason, Message: message},
		Plan: ps, GraceEndsAt: &p.GraceEndsAt, Evidence: ev,
		Milestone: &Milestone{Phase: lethev1.PhaseTombstoned, At: p.TombstonedAt, Evidence: ps, Note: note}}
}

// replicasAt answers CaughtUp with (ok, err).
func replicasAt(ok bool, err error) func(context.Context, string) (bool, error) {
	return func(context.Context, string) (bool, error) { return ok, err }
}

func TestTombstoningRun(t *testing.T) {
	const tombCall = "Ledger.Tombstone({req-uid [s1 s2 s3] grace=168h0m0s})"
	const tombReplicaCall = "Replicas.CaughtUp(0/2000028)"
	found := tombstoned(foundPlan(), foundPlanStatus(), lethev1.ReasonSessionsTombstoned,
		"the requested sessions of this tenant are tombstoned and hidden from every read path", "2 of 3 sessions found and tombstoned")
	none := Plan{NotFound: []string{"s1", "s2", "s3"}, TombstonedAt: dbNow, GraceEndsAt: dbNow.Add(168 * time.Hour)}
	noneStatus := &lethev1.ErasurePlan{NotFoundSessionIDs: []lethev1.SessionID{"s1", "s2", "s3"}, PlannedAt: secs(dbNow)}
	noneFound := tombstoned(none, noneStatus, lethev1.ReasonNoSessionsFound,
		"none of the requested sessions exists for this store's tenant; nothing was touched", "0 of 3 sessions found and tombstoned")
	nowPlan := foundPlan()
	nowPlan.GraceEndsAt = nowPlan.TombstonedAt
	foundNow := tombstoned(nowPlan, foundPlanStatus(), lethev1.ReasonSessionsTombstoned, found.Condition.Message, found.Milestone.Note)
	failedCond := &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonDatabaseUnavailable, Message: "the tombstone transaction failed; Lethe retries"}
	configCond := &Condition{Type: lethev1.ConditionTombstoned, Reason: errConfig.Reason, Message: errConfig.Message}
	recordedDone := func(o Outcome) recorded {
		return after(atTombstone(), withCond(o.Condition), withPlan(o.Plan), withGraceEndsAt(*o.GraceEndsAt), withEvidence(*o.Evidence),
			withEntry(lethev1.PhaseTombstoned, "", dbNow))
	}
	tombLagging := &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonReplicaLagging,
		Message: "tombstoned on the primary; waiting for every replica to replay the tombstone (until then a replica serves the sessions)"}
	tombReplicaDown := &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonReplicaLagging,
		Message: "tombstoned on the primary; a replica could not be asked whether it replayed the tombstone and is retried"}
	cancelledOut := Outcome{Kind: Stalled, RequeueAfter: testConfig.ReverifyInterval, Condition: &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonCancelledInDatabase,
		Message: "the database holds a Cancelled receipt for this request (its tombstones were lifted as if it were gone): its sessions are not tombstoned again; apply the request again under a new name"}}
	runCases(t, runTombstoning, map[string]stepCase{
		"SessionsFound": {reason: "The sessions found are tombstoned: plan, grace end, evidence and milestone come from the transaction, by the database's clock.",
			er: atTombstone(), fakes: fakes{ledger: tombstoneReturns(foundPlan(), nil), replicas: replicasAt(true, nil)},
			want: stepWant{out: found, status: recordedDone(found), calls: []string{tombCall, tombReplicaCall}}},
		"ReplicaLagging": {reason: "A replica that has not replayed the tombstone still serves the sessions: the step waits, recording nothing; the next pass repeats the tombstone.",
			er: atTombstone(), fakes: fakes{ledger: tombstoneReturns(foundPlan(), nil), replicas: replicasAt(false, nil)},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: tombLagging, RequeueAfter: testConfig.ReplicaRecheck},
				status: after(atTombstone(), withCond(tombLagging)), calls: []string{tombCall, tombReplicaCall}}},
		"ReplicaError": {reason: "A replica that cannot be asked is an error for a retry; nothing is recorded.",
			er: atTombstone(), fakes: fakes{ledger: tombstoneReturns(foundPlan(), nil), replicas: replicasAt(false, errPort)},
			want: stepWant{out: Outcome{Kind: Errored, Condition: tombReplicaDown}, err: errPort,
				status: after(atTombstone(), withCond(tombReplicaDown)), calls: []string{tombCall, tombReplicaCall}}},
		"NoSessionsFound": {reason: "A request none of whose sessions exists is done, and says nothing was touched.",
			er: atTombstone(), fakes: fakes{ledger: tombstoneReturns(none, nil)},
			want: stepWant{out: noneFound, status: recordedDone(noneFound), calls: []string{tombCall}}},
		"Immediate": {reason: "An immediate request asks the ledger for no grace period, whatever spec.gracePeriod says.",
			er: reached(0, immediate), fakes: fakes{ledger: tombstoneReturns(nowPlan, nil), replicas: replicasAt(true, nil)},
			want: stepWant{out: foundNow, status: recordedDone(foundNow), calls: []string{"Ledger.Tombstone({req-uid [s1 s2 s3] grace=0s})", tombReplicaCall}}},
		"LedgerError": {reason: "A failed transaction is returned for a retry with backoff; the condition's message stays stable.",
			er: atTombstone(), fakes: fakes{ledger: tombstoneReturns(Plan{}, errPort)},
			want: stepWant{out: Outcome{Kind: Errored, Condition: failedCond}, err: errPort,
				status: after(atTombstone(), withCond(failedCond)), calls: []string{tombCall}}},
		"ConfigError": {reason: "A configuration a human must fix waits with its own reason and message, and is no controller error.",
			er: atTombstone(), fakes: fakes{ledger: tombstoneReturns(Plan{}, fmt.Errorf("open primary: %w", errConfig))},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: configCond, RequeueAfter: testConfig.RetryAfter},
				status: after(atTombstone(), withCond(configCond)), calls: []string{tombCall}}},
		"CancelledInTheDatabase": {reason: "A request whose cancel the database holds (its tombstones lifted as if it were gone) is not tombstoned again: it stalls, saying so, for a human to apply it again.",
			er: atTombstone(), fakes: fakes{ledger: tombstoneReturns(Plan{}, fmt.Errorf("tombstone: %w", ErrCancelled))},
			want: stepWant{out: cancelledOut, status: after(atTombstone(), withCond(cancelledOut.Condition)), calls: []string{tombCall}}},
		"AlreadyTombstoned": {reason: "A step whose condition is True is done without calling any port, even with spec.cancel set (the grace step's business).",
			er: reached(1, cancelled), want: stepWant{out: Outcome{Kind: Done}, status: after(reached(1))}},
	})
}

// counted is the graph's count of what derives only from s1 and s2.
var counted = GraphCounts{Nodes: map[string]int64{"Fact": 4, "Entity": 1}, Relationships: map[string]int64{"MENTIONS": 6}}

func dryRunFakes(countErr, installedErr error, installed bool) fakes {
	return fakes{
		ledger: LedgerFns{PlanFn: func(context.Context, Request) (Plan, error) { return foundPlan(), nil }},
		graph:  &GraphFns{CountFn: func(context.Context, []string) (GraphCounts, error) { return counted, countErr }},
		backups: &BackupsFns{InstalledFn: func(context.Context) (bool, error) { return installed, installedErr },
			HoldingFn: func(context.Context, BackupScope, BackupRequest) (int, error) { return 2, nil }},
	}
}

// planned is the Ended outcome of a dry run.
func planned(ps *lethev1.ErasurePlan) Outcome {
	return Outcome{Kind: Ended, Plan: ps,
		Condition: &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonDryRun, Message: "dry run: the plan is in status.plan and nothing was tombstoned"},
		Milestone: &Milestone{Phase: lethev1.PhasePlanned, Event: lethev1.ReasonDryRun, At: dbNow, Evidence: ps, Note: "dry run planned: 2 of 3 sessions found"}}
}

func TestTombstoningDryRun(t *testing.T) {
	const planCall, countCall = "Ledger.Plan({req-uid [s1 s2 s3] grace=168h0m0s})", "Graph.Count([s1 s2])"
	const holdingCall = "Backups.Holding(velero-ns app=memory, {req-uid / immediate=false deletedAt=2030-01-10T11:00:00.25Z window=0s})"
	full := foundPlanStatus()
	full.GraphNodes, full.GraphRelationships, full.Backups = 5, 6, 2
	noBackups := foundPlanStatus()
	noBackups.GraphNodes, noBackups.GraphRelationships = 5, 6
	both := newStore(withGraph, withVelero)
	recordedPlan := func(o Outcome) recorded {
		return after(reached(0), withCond(o.Condition), withPlan(o.Plan), withEntry(lethev1.PhasePlanned, lethev1.ReasonDryRun, dbNow))
	}
	graphDown := &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonGraphUnavailable, Message: "the graph could not be counted for the plan; Lethe retries"}
	planDown := &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonDatabaseUnavailable, Message: "the plan could not be taken; Lethe retries"}
	graphConfig := &Condition{Type: lethev1.ConditionTombstoned, Reason: errConfig.Reason, Message: errConfig.Message}
	noPlan := dryRunFakes(nil, nil, true)
	noPlan.ledger.PlanFn = func(context.Context, Request) (Plan, error) { return Plan{}, errPort }
	runCases(t, runTombstoning, map[string]stepCase{
		"PlansEverything": {reason: "A dry run plans the rows, counts the graph elements and the Backups that would hold the sessions, and ends.",
			er: reached(0, dryRun), store: both, fakes: dryRunFakes(nil, nil, true),
			want: stepWant{out: planned(full), status: recordedPlan(planned(full)), calls: []string{planCall, countCall, "Backups.Installed()", holdingCall}}},
		"NoGraphNoVelero": {reason: "A store without graph or Velero plans the rows only.",
			er: reached(0, dryRun), fakes: fakes{ledger: dryRunFakes(nil, nil, true).ledger},
			want: stepWant{out: planned(foundPlanStatus()), status: recordedPlan(planned(foundPlanStatus())), calls: []string{planCall}}},
		"VeleroNotInstalled": {reason: "While Velero is not installed no Backup can hold the sessions: zero, and Holding is not asked.",
			er: reached(0, dryRun), store: both, fakes: dryRunFakes(nil, nil, false),
			want: stepWant{out: planned(noBackups), status: recordedPlan(planned(noBackups)), calls: []string{planCall, countCall, "Backups.Installed()"}}},
		"GraphDown": {reason: "A graph that cannot be counted fails the plan with GraphUnavailable, for a retry.",
			er: reached(0, dryRun), store: both, fakes: dryRunFakes(errPort, nil, true),
			want: stepWant{out: Outcome{Kind: Errored, Condition: graphDown}, err: errPort,
				status: after(reached(0), withCond(graphDown)), calls: []string{planCall, countCall}}},
		"GraphConfigError": {reason: "A graph whose Secret is missing waits with the ConfigError's reason and message.",
			er: reached(0, dryRun), store: both, fakes: dryRunFakes(errConfig, nil, true),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: graphConfig, RequeueAfter: testConfig.RetryAfter},
				status: after(reached(0), withCond(graphConfig)), calls: []string{planCall, countCall}}},
		"PlanError": {reason: "A plan the database could not take fails with DatabaseUnavailable; nothing else is asked.",
			er: reached(0, dryRun), store: both, fakes: noPlan,
			want: stepWant{out: Outcome{Kind: Errored, Condition: planDown}, err: errPort,
				status: after(reached(0), withCond(planDown)), calls: []string{planCall}}},
		"VeleroError": {reason: "Velero's discovery failing is an error for a retry; no plan is written half-counted.",
			er: reached(0, dryRun), store: both, fakes: dryRunFakes(nil, errPort, false),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(reached(0)), calls: []string{planCall, countCall, "Backups.Installed()"}}},
		"AlreadyPlannedTombstoned": {reason: "A True Tombstoned condition is done at once, dry run or not, calling no port.",
			er: reached(1, dryRun), store: both, want: stepWant{out: Outcome{Kind: Done}, status: after(reached(1))}},
	})
}

// TestTombstoningGraceAndDeadline: a grace period below the manager's
// minimum stalls the request before anything is touched (an immediate one
// goes ahead); a grace period plus the store's rotation window ending after
// the deadline is said on the condition and in a Warning.
func TestTombstoningGraceAndDeadline(t *testing.T) {
	cfg := testConfig
	cfg.MinGracePeriod = time.Hour
	run := func(ctx context.Context, s *Scope) Outcome { return Tombstoning{Config: cfg}.Run(ctx, s) }
	short := func(er *lethev1.ErasureRequest) { er.Spec.GracePeriod = &metav1.Duration{Duration: 30 * time.Minute} }
	tooShort := &Condition{Type: lethev1.ConditionTombstoned, Reason: lethev1.ReasonGracePeriodTooShort,
		Message: "spec.gracePeriod 30m0s is below the minimum of 1h0m0s (the manager's --min-grace-period): the grace period is the undo for typos; " +
			"create the request again with a longer one, or with immediate: true and a reason"}
	runCases(t, run, map[string]stepCase{
		"GraceTooShort": {reason: "A grace period below the minimum stalls the request, touching nothing.",
			er: reached(0, short),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: tooShort, RequeueAfter: cfg.ReverifyInterval},
				status: after(reached(0, short), withCond(tooShort))}},
	})

	immediateShort := reached(0, short, immediate)
	ok := runFakes(t, run, immediateShort, fakes{ledger: tombstoneReturns(foundPlan(), nil), replicas: replicasAt(true, nil)})
	if ok.out.Kind != Done {
		t.Errorf("an immediate request with a short grace period: kind %d, want Done", ok.out.Kind)
	}

	late := reached(0, func(er *lethev1.ErasureRequest) { er.Status.Deadline = secs(dbNow.Add(168*time.Hour + 12*time.Hour)) })
	out, _, _ := runCase(t, run, stepCase{reason: "deadline", er: late, store: newStore(withVelero),
		fakes: fakes{ledger: tombstoneReturns(foundPlan(), nil), replicas: replicasAt(true, nil)}})
	if out.Kind != Done || out.Warning == nil || out.Warning.Reason != lethev1.ReasonDeadlineAtRisk ||
		!strings.HasSuffix(out.Condition.Message, "end after status.deadline: the data would outlive it in backups") {
		t.Errorf("grace 168h + window 24h past a deadline 180h away: %+v, want Done with a DeadlineAtRisk warning and the condition saying so", out)
	}
	fits := reached(0, func(er *lethev1.ErasureRequest) { er.Status.Deadline = secs(dbNow.Add(30 * 24 * time.Hour)) })
	out, _, _ = runCase(t, run, stepCase{reason: "deadline", er: fits, store: newStore(withVelero),
		fakes: fakes{ledger: tombstoneReturns(foundPlan(), nil), replicas: replicasAt(true, nil)}})
	if out.Warning != nil {
		t.Errorf("grace and window well before the deadline: warning %+v, want none", out.Warning)
	}
}

// TestTombstoningCancelLiftsALostTombstone: a request cancelled before its
// status says Tombstoned asks the ledger to cancel — a pass may have
// committed the tombstone and lost its status write — and ends Cancelled
// with what the cancel lifted (nothing, when there was no tombstone).
func TestTombstoningCancelLiftsALostTombstone(t *testing.T) {
	for _, lifted := range []int64{0, 2} {
		got := runFakes(t, runTombstoning, reached(0, cancelled),
			fakes{ledger: LedgerFns{CancelFn: cancelReturns(Cancellation{Lifted: lifted, At: dbNow}, nil)}})
		if got.out.Kind != Ended || got.out.Milestone == nil || got.out.Milestone.Phase != lethev1.PhaseCancelled {
			t.Fatalf("lifted %d: %+v, want Ended at Cancelled", lifted, got.out)
		}
		if !slices.Equal(got.calls, []string{"Ledger.Cancel(req-uid)"}) {
			t.Errorf("lifted %d: calls %v, want the ledger's cancel", lifted, got.calls)
		}
		if ev, _ := got.out.Milestone.Evidence.(map[string]int64); ev["tombstonesLifted"] != lifted {
			t.Errorf("milestone evidence %v, want %d tombstones lifted", got.out.Milestone.Evidence, lifted)
		}
	}
}
