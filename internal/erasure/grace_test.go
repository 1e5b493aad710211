package erasure

import (
	"context"
	"fmt"
	"testing"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

func runGraceWait(ctx context.Context, s *Scope) Outcome {
	return GraceWait{Config: testConfig}.Run(ctx, s)
}

// graceEnds is the end of the grace period by the database's clock: two
// and a half hours after dbNow, but an hour and a half after now.
var graceEnds = time.Date(2030, 1, 10, 13, 30, 0, 0, time.UTC)

func graceReturns(gs GraceState, err error) func(context.Context, string) (GraceState, error) {
	return func(context.Context, string) (GraceState, error) { return gs, err }
}

func cancelReturns(c Cancellation, err error) func(context.Context, string) (Cancellation, error) {
	return func(context.Context, string) (Cancellation, error) { return c, err }
}

var (
	elapsedCond = &Condition{Type: lethev1.ConditionGracePeriodElapsed, OK: true, Reason: lethev1.ReasonGraceElapsed,
		Message: "the grace period has elapsed by the database's clock"}
	immediateCond = &Condition{Type: lethev1.ConditionGracePeriodElapsed, OK: true, Reason: lethev1.ReasonImmediate,
		Message: "spec.immediate skips the grace period; spec.reason says why"}
	cancelledCond = &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonCancelled,
		Message: "spec.cancel: the tombstones were lifted before deletion"}
)

// elapsedAt is the Done outcome of a grace period over by the database's clock at dbAt.
func elapsedAt(dbAt, ends time.Time, endsRFC3339 string) Outcome {
	return Outcome{Kind: Done, Condition: elapsedCond, GraceEndsAt: &ends,
		Milestone: &Milestone{Phase: lethev1.PhaseGracePeriod, At: dbAt,
			Evidence: map[string]string{"graceEndsAt": endsRFC3339}, Note: "grace period elapsed"}}
}

func immediateOutcome() Outcome {
	return Outcome{Kind: Done, Condition: immediateCond, Milestone: &Milestone{Phase: lethev1.PhaseGracePeriod, Event: lethev1.ReasonImmediate,
		At: now, Evidence: map[string]any{"reasonSha256": "078c722582ba0eb265aa4d18ecb12ce9463021d68d28542d84c14d0e77540e9c", "reasonLength": 32}, Note: "grace period skipped (immediate)"}}
}

// graceRecorded is a request whose tombstone recorded the grace period's end.
func graceRecorded(end time.Time) func(*lethev1.ErasureRequest) {
	return func(er *lethev1.ErasureRequest) { er.Status.GraceEndsAt = secs(end) }
}

func foundNone(er *lethev1.ErasureRequest) { er.Status.Plan.SessionsFound = 0 }

// resurrectedAt is a request whose history holds a re-tombstone at at.
func resurrectedAt(at time.Time) func(*lethev1.ErasureRequest) {
	return func(er *lethev1.ErasureRequest) {
		er.Status.History = evidence.Append(er.Status.History, lethev1.PhaseTombstoned, lethev1.ReasonResurrected, at, "sha256:fixture")
	}
}

// tombstonedAgainReturns is a Tombstone that finds s1 and s2 and reports
// a re-tombstone at at, its rows ending two seconds after graceEnds.
func tombstonedAgainReturns(at time.Time) func(context.Context, Request) (Plan, error) {
	return func(context.Context, Request) (Plan, error) {
		return Plan{Found: []string{"s1", "s2"}, TombstonedAt: at, GraceEndsAt: graceEnds.Add(retombstoneMargin), CommitLSN: "0/A0"}, nil
	}
}

func TestGraceWaitRun(t *testing.T) {
	waitCond := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonWaitingForGrace,
		Message: "waiting until status.graceEndsAt by the database's clock; set spec.cancel to undo"}
	readFailed := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonDatabaseUnavailable,
		Message: "the database clock could not be read; Lethe retries"}
	lostCond := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonWaitingForGrace,
		Message: "waiting until status.graceEndsAt by the database's clock; the database had lost the request's ledger rows and tombstones (a restore): its sessions are tombstoned again; set spec.cancel to undo"}
	nothingBack := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonWaitingForGrace,
		Message: "waiting until status.graceEndsAt by the database's clock; the database holds neither the request's ledger rows nor its sessions (a restore)"}
	const againNote = "a restore of the database took the request's ledger rows and tombstones; 2 session(s) tombstoned again until the recorded end of the grace period"
	retombFailed := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonDatabaseUnavailable,
		Message: "the database holds no ledger row of the request (restored from before it?); tombstoning its sessions again failed: retried"}
	configCond := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: errConfig.Reason, Message: errConfig.Message}
	lagCond := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonReplicaLagging,
		Message: "the sessions, back after a restore, are tombstoned again on the primary; waiting for every replica to replay it (until then a replica serves them)"}
	lagUnknown := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonReplicaLagging,
		Message: "the sessions, back after a restore, are tombstoned again on the primary; a replica could not be asked whether it replayed that and is retried"}
	elapsed := elapsedAt(dbNow, dbNow.Add(-time.Minute), "2030-01-10T10:59:00Z")
	imm := immediateOutcome()
	runCases(t, runGraceWait, map[string]stepCase{
		"AlreadyElapsed": {reason: "A True condition is done without calling any port.",
			er: reached(2), want: stepWant{out: Outcome{Kind: Done}, status: after(reached(2))}},
		"Immediate": {reason: "spec.immediate skips the wait without reading the database's clock; the milestone names it.",
			er:   reached(1, immediate),
			want: stepWant{out: imm, status: after(atGrace(), withCond(imm.Condition), withEntry(lethev1.PhaseGracePeriod, lethev1.ReasonImmediate, now))}},
		"Waiting": {reason: "Not elapsed: requeue when the grace ends by the DATABASE's clock (2h30m from dbNow, not 1h30m from the fake clock), plus a second.",
			er: atGrace(), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: graceEnds}, nil)}},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: waitCond, GraceEndsAt: &graceEnds, RequeueAfter: 2*time.Hour + 29*time.Minute + 59750*time.Millisecond + time.Second},
				status: after(atGrace(), withCond(waitCond), withGraceEndsAt(graceEnds)), calls: []string{"Ledger.Grace(req-uid)"}}},
		"Elapsed": {reason: "Elapsed by the database's clock, though not by the manager's: done, the milestone at the database's time.",
			er: atGrace(), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow.Add(-time.Minute), Elapsed: true}, nil)}},
			want: stepWant{out: elapsed, calls: []string{"Ledger.Grace(req-uid)"},
				status: after(atGrace(), withCond(elapsedCond), withGraceEndsAt(dbNow.Add(-time.Minute)), withEntry(lethev1.PhaseGracePeriod, "", dbNow))}},
		"LedgerLostWithinGrace": {reason: "A restore took every ledger row of the request and its tombstones: the sessions it found are tombstoned again, their grace period ending two seconds after the end the request recorded (kept in the status); once the replicas replayed it, the resurrection is recorded. It is not read as served.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow, Elapsed: true}, nil),
				TombstoneFn: tombstonedAgainReturns(dbNow)}, replicas: replicasAt(true, nil)},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: lostCond, RequeueAfter: graceEnds.Add(retombstoneMargin).Sub(dbNow) + time.Second,
				Milestone: &Milestone{Phase: lethev1.PhaseTombstoned, Event: lethev1.ReasonResurrected, At: dbNow,
					Evidence: map[string]any{"sessionsTombstonedAgain": 2, "graceEndsAt": "2030-01-10T13:30:00Z"}, Note: againNote},
				Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Tombstone", Note: againNote}},
				status: after(reached(1, graceRecorded(graceEnds)), withCond(lostCond), withEntry(lethev1.PhaseTombstoned, lethev1.ReasonResurrected, dbNow)),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2h30m1.75s})", "Replicas.CaughtUp(0/A0)"}}},
		"LedgerLostReplicaLagging": {reason: "Tombstoned again on the primary, but a replica has not replayed it: wait for the replicas, nothing recorded yet (a later pass repeats the tombstone).",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow, Elapsed: true}, nil),
				TombstoneFn: tombstonedAgainReturns(dbNow)}, replicas: replicasAt(false, nil)},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: lagCond, RequeueAfter: testConfig.ReplicaRecheck},
				status: after(reached(1, graceRecorded(graceEnds)), withCond(lagCond)),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2h30m1.75s})", "Replicas.CaughtUp(0/A0)"}}},
		"LedgerLostReplicaUnknown": {reason: "A replica that cannot be asked is an error for a retry; nothing recorded.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow, Elapsed: true}, nil),
				TombstoneFn: tombstonedAgainReturns(dbNow)}, replicas: replicasAt(false, errPort)},
			want: stepWant{out: Outcome{Kind: Errored, Condition: lagUnknown}, err: errPort,
				status: after(reached(1, graceRecorded(graceEnds)), withCond(lagUnknown)),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2h30m1.75s})", "Replicas.CaughtUp(0/A0)"}}},
		"TombstonedAgainNotRecorded": {reason: "The ledger rows are a re-tombstone's (ending 2 s after the recorded end) but the history has no resurrection since (replicas lagging, or a status write refused): the tombstone is repeated, and recorded once the replicas replayed it, at the re-tombstone's own time.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{
				GraceFn:     graceReturns(GraceState{Now: dbNow, GraceEndsAt: graceEnds.Add(retombstoneMargin), EarliestEnd: graceEnds.Add(retombstoneMargin), LedgerRows: 2, TombstonedAt: dbNow.Add(-time.Minute)}, nil),
				TombstoneFn: tombstonedAgainReturns(dbNow.Add(-time.Minute))}, replicas: replicasAt(true, nil)},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: lostCond, RequeueAfter: graceEnds.Add(retombstoneMargin).Sub(dbNow) + time.Second,
				Milestone: &Milestone{Phase: lethev1.PhaseTombstoned, Event: lethev1.ReasonResurrected, At: dbNow.Add(-time.Minute),
					Evidence: map[string]any{"sessionsTombstonedAgain": 2, "graceEndsAt": "2030-01-10T13:30:00Z"}, Note: againNote},
				Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Tombstone", Note: againNote}},
				status: after(reached(1, graceRecorded(graceEnds)), withCond(lostCond), withEntry(lethev1.PhaseTombstoned, lethev1.ReasonResurrected, dbNow.Add(-time.Minute))),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2h30m1.75s})", "Replicas.CaughtUp(0/A0)"}}},
		"TombstonedAgainRecorded": {reason: "The re-tombstone is in the history: wait by the ledger's end as usual, the status keeping the recorded end.",
			er: reached(1, graceRecorded(graceEnds), resurrectedAt(dbNow.Add(-time.Minute))), fakes: fakes{ledger: LedgerFns{
				GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: graceEnds.Add(retombstoneMargin), EarliestEnd: graceEnds.Add(retombstoneMargin), LedgerRows: 2, TombstonedAt: dbNow.Add(-time.Minute)}, nil)}},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: waitCond, GraceEndsAt: &graceEnds, RequeueAfter: graceEnds.Add(retombstoneMargin).Sub(dbNow) + time.Second},
				status: after(reached(1, graceRecorded(graceEnds), resurrectedAt(dbNow.Add(-time.Minute))), withCond(waitCond)),
				calls:  []string{"Ledger.Grace(req-uid)"}}},
		"EarlierResurrectionOnly": {reason: "The history's resurrection predates this re-tombstone (a second restore): this one is recorded too.",
			er: reached(1, graceRecorded(graceEnds), resurrectedAt(dbNow.Add(-time.Hour))), fakes: fakes{ledger: LedgerFns{
				GraceFn:     graceReturns(GraceState{Now: dbNow, GraceEndsAt: graceEnds.Add(retombstoneMargin), EarliestEnd: graceEnds.Add(retombstoneMargin), LedgerRows: 2, TombstonedAt: dbNow.Add(-time.Minute)}, nil),
				TombstoneFn: tombstonedAgainReturns(dbNow.Add(-time.Minute))}, replicas: replicasAt(true, nil)},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: lostCond, RequeueAfter: graceEnds.Add(retombstoneMargin).Sub(dbNow) + time.Second,
				Milestone: &Milestone{Phase: lethev1.PhaseTombstoned, Event: lethev1.ReasonResurrected, At: dbNow.Add(-time.Minute),
					Evidence: map[string]any{"sessionsTombstonedAgain": 2, "graceEndsAt": "2030-01-10T13:30:00Z"}, Note: againNote},
				Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Tombstone", Note: againNote}},
				status: after(reached(1, graceRecorded(graceEnds), resurrectedAt(dbNow.Add(-time.Hour))), withCond(lostCond), withEntry(lethev1.PhaseTombstoned, lethev1.ReasonResurrected, dbNow.Add(-time.Minute))),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2h30m1.75s})", "Replicas.CaughtUp(0/A0)"}}},
		"TombstonedAgainNotRecordedAfterEnd": {reason: "The record of a re-tombstone is still missing when the recorded end (and the ledger's) has passed: the repeat (its grace floored) records it, and the next pass ends the wait.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{
				GraceFn: graceReturns(GraceState{Now: graceEnds.Add(5 * time.Second), GraceEndsAt: graceEnds.Add(retombstoneMargin), EarliestEnd: graceEnds.Add(retombstoneMargin), Elapsed: true,
					LedgerRows: 2, TombstonedAt: dbNow}, nil),
				TombstoneFn: tombstonedAgainReturns(dbNow)}, replicas: replicasAt(true, nil)},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: lostCond, RequeueAfter: time.Second,
				Milestone: &Milestone{Phase: lethev1.PhaseTombstoned, Event: lethev1.ReasonResurrected, At: dbNow,
					Evidence: map[string]any{"sessionsTombstonedAgain": 2, "graceEndsAt": "2030-01-10T13:30:00Z"}, Note: againNote},
				Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Tombstone", Note: againNote}},
				status: after(reached(1, graceRecorded(graceEnds)), withCond(lostCond), withEntry(lethev1.PhaseTombstoned, lethev1.ReasonResurrected, dbNow)),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2s})", "Replicas.CaughtUp(0/A0)"}}},
		"RepeatedTombstoneAddedASession": {reason: "A repeat of the first tombstone found a session the first run did not: its row ends later, but the earliest end is the first run's: no re-tombstone, no resurrection recorded.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{
				GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: graceEnds.Add(10 * time.Second), EarliestEnd: graceEnds.Add(500 * time.Millisecond), LedgerRows: 3, TombstonedAt: dbNow.Add(-time.Hour)}, nil)}},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: waitCond, GraceEndsAt: ptr(graceEnds.Add(10 * time.Second)), RequeueAfter: graceEnds.Add(10*time.Second).Sub(dbNow) + time.Second},
				status: after(reached(1, graceRecorded(graceEnds)), withCond(waitCond), withGraceEndsAt(graceEnds.Add(10*time.Second))),
				calls:  []string{"Ledger.Grace(req-uid)"}}},
		"FirstTombstoneRows": {reason: "The first tombstone's rows end less than a second after the recorded end (the status keeps whole seconds): no re-tombstone.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{
				GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: graceEnds.Add(999 * time.Millisecond), EarliestEnd: graceEnds.Add(999 * time.Millisecond), LedgerRows: 2, TombstonedAt: dbNow.Add(-time.Hour)}, nil)}},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: waitCond, GraceEndsAt: ptr(graceEnds.Add(999 * time.Millisecond)), RequeueAfter: graceEnds.Add(999*time.Millisecond).Sub(dbNow) + time.Second},
				status: after(reached(1, graceRecorded(graceEnds)), withCond(waitCond)),
				calls:  []string{"Ledger.Grace(req-uid)"}}},
		"LedgerAndSessionsLost": {reason: "The dump predates the sessions too (or a restore is still loading them): nothing came back to hide, so no resurrection is recorded; looked at again after RetryAfter, not at the recorded end.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow, Elapsed: true}, nil),
				TombstoneFn: func(context.Context, Request) (Plan, error) {
					return Plan{NotFound: []string{"s1", "s2", "s3"}, TombstonedAt: dbNow}, nil
				}}},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: nothingBack, RequeueAfter: testConfig.RetryAfter},
				status: after(reached(1, graceRecorded(graceEnds)), withCond(nothingBack)),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2h30m1.75s})"}}},
		"LedgerLostTombstoneFails": {reason: "Tombstoning again fails: an error for a retry, the grace period not elapsed.",
			er: reached(1, graceRecorded(graceEnds)), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow, Elapsed: true}, nil),
				TombstoneFn: func(context.Context, Request) (Plan, error) { return Plan{}, errPort }}},
			want: stepWant{out: Outcome{Kind: Errored, Condition: retombFailed}, err: errPort,
				status: after(reached(1, graceRecorded(graceEnds)), withCond(retombFailed)),
				calls:  []string{"Ledger.Grace(req-uid)", "Ledger.Tombstone({req-uid [s1 s2 s3] grace=2h30m1.75s})"}}},
		"LedgerLostAfterGrace": {reason: "The ledger is gone and the recorded end has passed: done, the recorded end kept in the status and the milestone.",
			er: reached(1, graceRecorded(dbNow.Add(-time.Minute))), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow, Elapsed: true}, nil)}},
			want: stepWant{out: elapsedAt(dbNow, secs(dbNow.Add(-time.Minute)).Time, "2030-01-10T10:59:00Z"), calls: []string{"Ledger.Grace(req-uid)"},
				status: after(atGrace(), withCond(elapsedCond), withGraceEndsAt(dbNow.Add(-time.Minute)), withEntry(lethev1.PhaseGracePeriod, "", dbNow))}},
		"NoSessionsFoundNoLedger": {reason: "A request that found no session has no ledger row by design: nothing to wait for.",
			er:    reached(1, graceRecorded(graceEnds), foundNone),
			fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow, Elapsed: true}, nil)}},
			want: stepWant{out: elapsedAt(dbNow, dbNow, "2030-01-10T11:00:00Z"), calls: []string{"Ledger.Grace(req-uid)"},
				status: after(reached(1, foundNone), withGraceEndsAt(dbNow), withCond(elapsedCond), withEntry(lethev1.PhaseGracePeriod, "", dbNow))}},
		"LedgerError": {reason: "A clock that cannot be read is an error for a retry; the message stays stable.",
			er: atGrace(), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{}, errPort)}},
			want: stepWant{out: Outcome{Kind: Errored, Condition: readFailed}, err: errPort,
				status: after(atGrace(), withCond(readFailed)), calls: []string{"Ledger.Grace(req-uid)"}}},
		"ConfigError": {reason: "A configuration a human must fix waits with its reason and message.",
			er: atGrace(), fakes: fakes{ledger: LedgerFns{GraceFn: graceReturns(GraceState{}, errConfig)}},
			want: stepWant{out: Outcome{Kind: Waiting, Condition: configCond, RequeueAfter: testConfig.RetryAfter},
				status: after(atGrace(), withCond(configCond)), calls: []string{"Ledger.Grace(req-uid)"}}},
	})
}

func TestGraceWaitCancel(t *testing.T) {
	lifted := Cancellation{Lifted: 2, At: dbNow}
	ev := &lethev1.StepEvidence{Step: lethev1.ReasonCancelled, CompletedAt: secs(dbNow), Note: "2 tombstone(s) lifted; the ledger marks the request cancelled"}
	cancelOut := Outcome{Kind: Ended, Condition: cancelledCond, Evidence: ev, Milestone: &Milestone{Phase: lethev1.PhaseCancelled, At: dbNow,
		Evidence: map[string]int64{"tombstonesLifted": 2}, Note: "cancelled: tombstones lifted"}}
	cancelFailed := &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: lethev1.ReasonDatabaseUnavailable, Message: "the cancel could not be written; Lethe retries"}
	tooLate := cancelReturns(Cancellation{}, fmt.Errorf("request req-uid: %w", ErrTooLateToCancel))
	elapsed := elapsedAt(dbNow, dbNow.Add(-time.Minute), "2030-01-10T10:59:00Z")
	imm := immediateOutcome()
	runCases(t, runGraceWait, map[string]stepCase{
		"InTime": {reason: "A cancel before deletion lifts the tombstones and ends the request; the grace period is not read.",
			er: reached(1, cancelled), fakes: fakes{ledger: LedgerFns{CancelFn: cancelReturns(lifted, nil)}},
			want: stepWant{out: cancelOut, calls: []string{"Ledger.Cancel(req-uid)"},
				status: after(atGrace(), withCond(cancelledCond), withEvidence(*ev), withEntry(lethev1.PhaseCancelled, "", dbNow))}},
		"TooLate": {reason: "ErrTooLateToCancel (deletion started) is ignored: the step goes on as if not cancelled.",
			er: reached(1, cancelled), fakes: fakes{ledger: LedgerFns{CancelFn: tooLate,
				GraceFn: graceReturns(GraceState{Now: dbNow, GraceEndsAt: dbNow.Add(-time.Minute), Elapsed: true}, nil)}},
			want: stepWant{out: elapsed, calls: []string{"Ledger.Cancel(req-uid)", "Ledger.Grace(req-uid)"},
				status: after(atGrace(), withCond(elapsedCond), withGraceEndsAt(dbNow.Add(-time.Minute)), withEntry(lethev1.PhaseGracePeriod, "", dbNow))}},
		"TooLateImmediate": {reason: "A cancel too late on an immediate request goes on to the immediate milestone.",
			er: reached(1, cancelled, immediate), fakes: fakes{ledger: LedgerFns{CancelFn: tooLate}},
			want: stepWant{out: imm, calls: []string{"Ledger.Cancel(req-uid)"},
				status: after(atGrace(), withCond(imm.Condition), withEntry(lethev1.PhaseGracePeriod, lethev1.ReasonImmediate, now))}},
		"LedgerError": {reason: "A cancel that could not be written is an error for a retry, never an ignored cancel.",
			er: reached(1, cancelled), fakes: fakes{ledger: LedgerFns{CancelFn: cancelReturns(Cancellation{}, errPort)}},
			want: stepWant{out: Outcome{Kind: Errored, Condition: cancelFailed}, err: errPort,
				status: after(atGrace(), withCond(cancelFailed)), calls: []string{"Ledger.Cancel(req-uid)"}}},
		"ConfigError": {reason: "A cancel blocked by the configuration waits with the ConfigError's reason and message.",
			er: reached(1, cancelled), fakes: fakes{ledger: LedgerFns{CancelFn: cancelReturns(Cancellation{}, errConfig)}},
			want: stepWant{out: Outcome{Kind: Waiting, RequeueAfter: testConfig.RetryAfter,
				Condition: &Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: errConfig.Reason, Message: errConfig.Message}},
				status: after(atGrace(), withCond(&Condition{Type: lethev1.ConditionGracePeriodElapsed, Reason: errConfig.Reason, Message: errConfig.Message})),
				calls:  []string{"Ledger.Cancel(req-uid)"}}},
	})
}
