package erasure

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func runBackupRotation(ctx context.Context, s *Scope) Outcome {
	return BackupRotation{Config: testConfig}.Run(ctx, s)
}

func reverifyBackups(ctx context.Context, s *Scope) Outcome {
	return BackupRotation{Config: testConfig}.Reverify(ctx, s)
}

var (
	// committed is when the deletion committed, by the database's clock.
	committed = time.Date(2030, 1, 10, 9, 0, 0, 500_000_000, time.UTC)
	// daily was shortened to the deletion plus the store's 24h window.
	daily = Backup{Name: "daily-0109", UID: "b-1", StartedAt: committed.Add(-2 * time.Hour),
		OriginalExpiration: ptr(committed.Add(30 * 24 * time.Hour)), Expiration: ptr(committed.Add(24 * time.Hour)), Changed: true}
	// hourly expires ten minutes from now (by the manager's clock), before the window: left alone.
	hourly = Backup{Name: "hourly-0109", UID: "b-2", StartedAt: committed.Add(-26 * time.Hour),
		OriginalExpiration: ptr(time.Date(2030, 1, 10, 12, 10, 0, 0, time.UTC)), Expiration: ptr(time.Date(2030, 1, 10, 12, 10, 0, 0, time.UTC))}

	dailyEv = lethev1.BackupEvidence{Name: "daily-0109", StartedAt: secs(committed.Add(-2 * time.Hour)),
		OriginalExpiration: secs(committed.Add(30 * 24 * time.Hour)), Expiration: secs(committed.Add(24 * time.Hour))}
	hourlyEv = lethev1.BackupEvidence{Name: "hourly-0109", StartedAt: secs(committed.Add(-26 * time.Hour)),
		OriginalExpiration: secs(*hourly.Expiration), Expiration: secs(*hourly.Expiration)}
)

const (
	installedCall = "Backups.Installed()"
	deletedAtCall = "Ledger.DeletedAt(req-uid)"
	rotateCall    = "Backups.Rotate(velero-ns app=memory, {req-uid tenant-a/erase-alice immediate=false deletedAt=2030-01-10T09:00:00.5Z window=24h0m0s})"
	deadlineNote  = " Backup(s) may hold the erased sessions (started before the deletion committed, or up to the store's velero.clockSkew 5m0s after); each expires by 2030-01-11T09:00:00Z at the latest (deletion + rotationWindow 24h0m0s)"
)

// backupFakes is Velero installed, a deletion committed, and Rotate finding found.
func backupFakes(found []Backup, mods ...func(*fakes)) fakes {
	f := fakes{
		ledger: LedgerFns{DeletedAtFn: func(context.Context, string) (time.Time, error) { return committed, nil }},
		backups: &BackupsFns{InstalledFn: func(context.Context) (bool, error) { return true, nil },
			RotateFn: func(context.Context, BackupScope, BackupRequest) ([]Backup, error) { return found, nil }},
	}
	for _, m := range mods {
		m(&f)
	}
	return f
}

func gone(e lethev1.BackupEvidence) lethev1.BackupEvidence { e.GoneAt = secs(now); return e }

// rotatedEvidence is the step's evidence: what the counts say of the entries, and the note.
func rotatedEvidence(step string, shortened, deleteRequests, goneCount int64, note string, entries ...lethev1.BackupEvidence) lethev1.StepEvidence {
	n := int64(len(entries))
	return lethev1.StepEvidence{Step: step, StartedAt: secs(committed), Backups: entries,
		Counts: []lethev1.TableCount{{Table: "Velero Backups started before the deletion", Rows: n}, {Table: "expirations shortened", Rows: shortened},
			{Table: "DeleteBackupRequests created", Rows: deleteRequests}, {Table: "Backups gone", Rows: goneCount}},
		Verification: []lethev1.Verification{{Check: "Velero Backups that started before the deletion and still exist", Found: n - goneCount}},
		Note:         note}
}

func expiring(msg string) *Condition {
	return &Condition{Type: lethev1.ConditionBackupsRotated, Reason: lethev1.ReasonBackupsExpiring, Message: msg}
}

var backupsGone = &Condition{Type: lethev1.ConditionBackupsRotated, OK: true, Reason: lethev1.ReasonBackupsGone,
	Message: "no Velero Backup that started before the deletion remains"}

func TestBackupRotationRun(t *testing.T) {
	store := newStore(withVelero)
	two := rotatedEvidence(lethev1.ConditionBackupsRotated, 1, 0, 0, "2"+deadlineNote, dailyEv, hourlyEv)
	twoCond := expiring("2 Velero Backup(s) that may hold the erased sessions remain; they expire between 2030-01-10T12:10:00Z and 2030-01-11T09:00:00Z")
	one := rotatedEvidence(lethev1.ConditionBackupsRotated, 1, 0, 0, "1"+deadlineNote, dailyEv)
	oneCond := expiring("1 Velero Backup(s) that may hold the erased sessions remain; they expire between 2030-01-11T09:00:00Z and 2030-01-11T09:00:00Z")
	allGone := rotatedEvidence(lethev1.ConditionBackupsRotated, 1, 0, 2, "2"+deadlineNote, gone(dailyEv), gone(hourlyEv))
	seen := reached(4, withStepEvidence(two))
	none := rotatedEvidence(lethev1.ConditionBackupsRotated, 0, 0, 0, "0"+deadlineNote)
	calls := []string{installedCall, deletedAtCall, rotateCall}
	runCases(t, runBackupRotation, map[string]stepCase{
		"AlreadyRotated": {reason: "A True condition is done without calling any port.",
			er: completed(), store: store, fakes: fakes{backups: &BackupsFns{}}, want: stepWant{out: Outcome{Kind: Done}, status: after(completed())}},
		"BackupsRemaining": {reason: "Backups still exist: wait until the earliest expiration by the manager's clock, plus a second.",
			er: atBackups(), store: store, fakes: backupFakes([]Backup{hourly, daily}),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: twoCond, Evidence: &two, Work: Work{Backups: []Backup{hourly, daily}},
				RequeueAfter: 9*time.Minute + 59300*time.Millisecond + time.Second},
				status: after(atBackups(), withCond(twoCond), withEvidence(two)), calls: calls}},
		"BoundedByRecheck": {reason: "An expiration further away than BackupRecheck is looked at again after BackupRecheck.",
			er: atBackups(), store: store, fakes: backupFakes([]Backup{daily}),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: oneCond, Evidence: &one, Work: Work{Backups: []Backup{daily}}, RequeueAfter: time.Hour},
				status: after(atBackups(), withCond(oneCond), withEvidence(one)), calls: calls}},
		"AllGone": {reason: "Backups recorded earlier and not found any more are gone from now (the fake clock): done.",
			er: seen, store: store, fakes: backupFakes(nil),
			want: stepWant{out: Outcome{Kind: Done, Condition: backupsGone, Evidence: &allGone,
				Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, At: now, Evidence: allGone, Note: allGone.Note}},
				status: after(seen, withCond(backupsGone), withEvidence(allGone), withEntry(lethev1.PhaseBackupsRotated, "", now)), calls: calls}},
		"NoBackupEver": {reason: "No Backup started before the deletion: done at once, with empty evidence.",
			er: atBackups(), store: store, fakes: backupFakes(nil),
			want: stepWant{out: Outcome{Kind: Done, Condition: backupsGone, Evidence: &none,
				Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, At: now, Evidence: none, Note: none.Note}},
				status: after(atBackups(), withCond(backupsGone), withEvidence(none), withEntry(lethev1.PhaseBackupsRotated, "", now)), calls: calls}},
	})
}

func TestBackupRotationImmediate(t *testing.T) {
	deleting := Backup{Name: "daily-0109", StartedAt: daily.StartedAt, OriginalExpiration: daily.OriginalExpiration,
		Expiration: daily.OriginalExpiration, DeleteRequest: "erase-alice-daily-0109", Changed: true}
	entry := lethev1.BackupEvidence{Name: "daily-0109", StartedAt: dailyEv.StartedAt, OriginalExpiration: dailyEv.OriginalExpiration,
		Expiration: dailyEv.OriginalExpiration, DeleteBackupRequest: "erase-alice-daily-0109"}
	ev := rotatedEvidence(lethev1.ConditionBackupsRotated, 0, 1, 0,
		"1 Backup(s) may hold the erased sessions; immediate: a DeleteBackupRequest asks Velero to delete each now", entry)
	cond := expiring("1 Velero Backup(s) that may hold the erased sessions remain; a DeleteBackupRequest was created for each")
	failedDeletion := deleting
	failedDeletion.DeleteFailed = "cannot delete backup because backup storage location default is currently in read-only mode"
	failedCond := condition(lethev1.ConditionBackupsRotated, false, lethev1.ReasonBackupDeletionFailed,
		"Velero could not delete 1 Backup(s); Backup daily-0109 (DeleteBackupRequest erase-alice-daily-0109): cannot delete backup because backup storage location default is currently in read-only mode. Fix the cause, then delete the failed DeleteBackupRequest and Lethe asks Velero again")
	er := reached(4, immediate)
	allowed := newStore(withVelero, func(s *lethev1.MemoryStore) { s.Spec.Velero.DeleteOnImmediate = true })
	// Not allowed: the Backup is shortened to the deadline, and kept past it by a floor.
	floored := newStore(withVelero, func(s *lethev1.MemoryStore) {
		s.Spec.Velero.MinRetention = &metav1.Duration{Duration: 30 * 24 * time.Hour}
	})
	keptUntil := daily.StartedAt.Add(30 * 24 * time.Hour)
	kept := Backup{Name: "daily-0109", StartedAt: daily.StartedAt, OriginalExpiration: daily.OriginalExpiration, Expiration: &keptUntil, Changed: true}
	keptEntry := lethev1.BackupEvidence{Name: "daily-0109", StartedAt: dailyEv.StartedAt, OriginalExpiration: dailyEv.OriginalExpiration, Expiration: secs(keptUntil)}
	keptEv := rotatedEvidence(lethev1.ConditionBackupsRotated, 1, 0, 0,
		"1 Backup(s) may hold the erased sessions (started before the deletion committed, or up to the store's velero.clockSkew 5m0s after); each expires by 2030-01-11T09:00:00Z at the latest (deletion + rotationWindow 24h0m0s); immediate, but the store's velero.deleteOnImmediate is off: shortened, not deleted; never before its start + the store's velero.minRetention 720h0m0s", keptEntry)
	keptCond := expiring("1 Velero Backup(s) that may hold the erased sessions remain; they expire between " + keptUntil.UTC().Format(time.RFC3339) +
		" and " + keptUntil.UTC().Format(time.RFC3339) + "; 1 kept past the request's deadline 2030-01-11T09:00:00Z by the store's velero.minRetention")
	runCases(t, runBackupRotation, map[string]stepCase{
		"Immediate": {reason: "An immediate request, where the store allows it, asks Velero to delete each Backup and waits for them to go.",
			er: er, store: allowed, fakes: backupFakes([]Backup{deleting}),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: cond, Evidence: &ev, Work: Work{Backups: []Backup{deleting}}, RequeueAfter: deleteRecheck},
				status: after(er, withCond(cond), withEvidence(ev)),
				calls: []string{installedCall, deletedAtCall,
					"Backups.Rotate(velero-ns app=memory deleteOnImmediate, {req-uid tenant-a/erase-alice immediate=true deletedAt=2030-01-10T09:00:00.5Z window=24h0m0s})"}}},
		"DeletionFailed": {reason: "Velero failed the DeleteBackupRequest: the step stalls on a human with Velero's error, and asks nothing more of Velero.",
			er: er, store: allowed, fakes: backupFakes([]Backup{failedDeletion}),
			want: stepWant{out: Outcome{Kind: Stalled, Condition: failedCond, Evidence: &ev, Work: Work{Backups: []Backup{failedDeletion}}, RequeueAfter: time.Hour},
				status: after(er, withCond(failedCond), withEvidence(ev)),
				calls: []string{installedCall, deletedAtCall,
					"Backups.Rotate(velero-ns app=memory deleteOnImmediate, {req-uid tenant-a/erase-alice immediate=true deletedAt=2030-01-10T09:00:00.5Z window=24h0m0s})"}}},
		"ImmediateNotAllowedFloored": {reason: "Without deleteOnImmediate an immediate request shortens, and says so; a retention floor keeps the Backup past the deadline, and the condition says so.",
			er: er, store: floored, fakes: backupFakes([]Backup{kept}),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: keptCond, Evidence: &keptEv, Work: Work{Backups: []Backup{kept}}, RequeueAfter: time.Hour},
				status: after(er, withCond(keptCond), withEvidence(keptEv)),
				calls: []string{installedCall, deletedAtCall,
					"Backups.Rotate(velero-ns app=memory minRetention=720h0m0s, {req-uid tenant-a/erase-alice immediate=true deletedAt=2030-01-10T09:00:00.5Z window=24h0m0s})"}}},
	})
}

func TestBackupRotationBlocked(t *testing.T) {
	notConfigured := &Condition{Type: lethev1.ConditionBackupsRotated, OK: true, Reason: lethev1.ReasonNotConfigured, Message: "no Velero backups are configured for this store"}
	noVelero := &Condition{Type: lethev1.ConditionBackupsRotated, Reason: lethev1.ReasonVeleroNotInstalled,
		Message: "Velero's CRDs (velero.io/v1 Backup and DeleteBackupRequest) are not served; the request waits and goes on once they are installed"}
	invalid := &Condition{Type: lethev1.ConditionBackupsRotated, Reason: lethev1.ReasonInvalidSpec,
		Message: `the store's velero.backupSelector is invalid: "Near" is not a valid label selector operator`}
	ledgerDown := &Condition{Type: lethev1.ConditionBackupsRotated, Reason: lethev1.ReasonDatabaseUnavailable, Message: "the erasure ledger could not be read; Lethe retries"}
	rotateFailed := expiring("the Velero Backups could not be updated; Lethe retries")
	configCond := &Condition{Type: lethev1.ConditionBackupsRotated, Reason: errConfig.Reason, Message: errConfig.Message}
	nothing := &Condition{Type: lethev1.ConditionBackupsRotated, OK: true, Reason: lethev1.ReasonNoSessionsFound, Message: "the request erased no session: no backup holds its data"}
	store, base := newStore(withVelero), atBackups()
	badSelector := newStore(withVelero, func(s *lethev1.MemoryStore) {
		s.Spec.Velero.BackupSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near", Values: []string{"memory"}}}}
	})
	installed := func(ok bool, err error) func(*fakes) {
		return func(f *fakes) { f.backups.InstalledFn = func(context.Context) (bool, error) { return ok, err } }
	}
	deletedAt := func(at time.Time, err error) func(*fakes) {
		return func(f *fakes) {
			f.ledger.DeletedAtFn = func(context.Context, string) (time.Time, error) { return at, err }
		}
	}
	rotateFails := func(err error) func(*fakes) {
		return func(f *fakes) {
			f.backups.RotateFn = func(context.Context, BackupScope, BackupRequest) ([]Backup, error) { return nil, err }
		}
	}
	waitFor := func(c *Condition, after time.Duration) Outcome {
		return Outcome{Kind: Waiting, Condition: c, RequeueAfter: after}
	}
	runCases(t, runBackupRotation, map[string]stepCase{
		"NotConfigured": {reason: "A store without Velero completes the step at once; the history says it was not configured.",
			er: base, want: stepWant{out: Outcome{Kind: Done, Condition: notConfigured, Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated,
				Event: lethev1.ReasonNotConfigured, At: now, Evidence: map[string]string{"step": lethev1.ConditionBackupsRotated, "reason": lethev1.ReasonNotConfigured},
				Note: "BackupsRotated: not configured"}}, status: after(base, withCond(notConfigured), withEntry(lethev1.PhaseBackupsRotated, lethev1.ReasonNotConfigured, now))}},
		"VeleroNotInstalled": {reason: "Velero's CRDs not served: wait for them; the ledger is not read.",
			er: base, store: store, fakes: backupFakes(nil, installed(false, nil)),
			want: stepWant{out: waitFor(noVelero, testConfig.RetryAfter), status: after(base, withCond(noVelero)), calls: []string{installedCall}}},
		"InstalledError": {reason: "Discovery failing is an error for a retry, with the same stable condition.",
			er: base, store: store, fakes: backupFakes(nil, installed(false, errPort)),
			want: stepWant{out: Outcome{Kind: Errored, Condition: noVelero, RequeueAfter: testConfig.RetryAfter}, err: errPort,
				status: after(base, withCond(noVelero)), calls: []string{installedCall}}},
		"InvalidSelector": {reason: "A selector that does not parse needs the store fixed: wait with InvalidSpec, rotate nothing.",
			er: base, store: badSelector, fakes: backupFakes(nil),
			want: stepWant{out: waitFor(invalid, testConfig.BackupRecheck), status: after(base, withCond(invalid)), calls: []string{installedCall}}},
		"LedgerError": {reason: "A deletion time that cannot be read is the database's error; Velero is not changed.",
			er: base, store: store, fakes: backupFakes(nil, deletedAt(time.Time{}, errPort)),
			want: stepWant{out: Outcome{Kind: Errored, Condition: ledgerDown}, err: errPort, status: after(base, withCond(ledgerDown)), calls: []string{installedCall, deletedAtCall}}},
		"NothingErased": {reason: "A request that erased nothing (DeletedAt zero) has no Backup holding its data: done, Rotate not called.",
			er: base, store: store, fakes: backupFakes(nil, deletedAt(time.Time{}, nil)),
			want: stepWant{out: Outcome{Kind: Done, Condition: nothing, Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, Event: lethev1.ReasonNoSessionsFound,
				At: now, Evidence: map[string]int{"backups": 0}, Note: "no backup to rotate"}},
				status: after(base, withCond(nothing), withEntry(lethev1.PhaseBackupsRotated, lethev1.ReasonNoSessionsFound, now)), calls: []string{installedCall, deletedAtCall}}},
		"RotateError": {reason: "Backups that could not be updated are an error for a retry; the message stays stable.",
			er: base, store: store, fakes: backupFakes(nil, rotateFails(errPort)),
			want: stepWant{out: Outcome{Kind: Errored, Condition: rotateFailed}, err: errPort, status: after(base, withCond(rotateFailed)),
				calls: []string{installedCall, deletedAtCall, rotateCall}}},
		"RotateConfigError": {reason: "A configuration a human must fix waits with the ConfigError's reason and message.",
			er: base, store: store, fakes: backupFakes(nil, rotateFails(errConfig)),
			want: stepWant{out: waitFor(configCond, testConfig.RetryAfter), status: after(base, withCond(configCond)), calls: []string{installedCall, deletedAtCall, rotateCall}}},
	})
}

func TestBackupRotationReverify(t *testing.T) {
	ev := rotatedEvidence(lethev1.ReasonResurrected, 1, 0, 0,
		"1 Velero Backup(s) holding erased data reappeared (re-synced from their bucket?) and were made to expire again", dailyEv)
	found := []Backup{daily, hourly}
	store, base := newStore(withVelero), completed()
	noSessions := reached(5, withStatusCondition(lethev1.ConditionBackupsRotated, true, lethev1.ReasonNoSessionsFound))
	calls := []string{installedCall, deletedAtCall, rotateCall}
	runCases(t, reverifyBackups, map[string]stepCase{
		"NoVelero": {reason: "A store without Velero has nothing to check.",
			er: base, want: stepWant{out: Outcome{Kind: Done}, status: after(base)}},
		"NotRotatedByTheStep": {reason: "A step completed without Backups (nothing erased) is not re-verified: no port is called.",
			er: noSessions, store: store, fakes: fakes{backups: &BackupsFns{}}, want: stepWant{out: Outcome{Kind: Done}, status: after(noSessions)}},
		"Unchanged": {reason: "Every Backup already expires in time: done, nothing recorded but the work.",
			er: base, store: store, fakes: backupFakes([]Backup{hourly}),
			want: stepWant{out: Outcome{Kind: Done, Work: Work{Backups: []Backup{hourly}}}, status: after(base), calls: calls}},
		"Resynced": {reason: "A Backup re-synced from its bucket with its original expiration is shortened again: a Resurrected milestone and a Warning.",
			er: base, store: store, fakes: backupFakes(found),
			want: stepWant{out: Outcome{Kind: Done, Evidence: &ev, Work: Work{Backups: found},
				Milestone: &Milestone{Phase: lethev1.PhaseBackupsRotated, Event: lethev1.ReasonResurrected, At: now, Evidence: ev, Note: ev.Note},
				Warning:   &Warning{Reason: lethev1.ReasonResurrected, Action: "Rotate", Note: "1 Velero Backup(s) holding erased data reappeared and were made to expire again"}},
				status: after(base, withEvidence(ev), withEntry(lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, now)), calls: calls}},
		"NothingErased": {reason: "A request that erased nothing has no Backup to check.",
			er: base, store: store, fakes: backupFakes(nil, func(f *fakes) {
				f.ledger.DeletedAtFn = func(context.Context, string) (time.Time, error) { return time.Time{}, nil }
			}),
			want: stepWant{out: Outcome{Kind: Done}, status: after(base), calls: []string{installedCall, deletedAtCall}}},
		"RotateError": {reason: "A rotation that failed is an error for a retry; the completed step's condition stays.",
			er: base, store: store, fakes: backupFakes(nil, func(f *fakes) {
				f.backups.RotateFn = func(context.Context, BackupScope, BackupRequest) ([]Backup, error) { return nil, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(base), calls: calls}},
		"VeleroGone": {reason: "Velero uninstalled after completion: the re-verification waits for it; the condition stays.",
			er: base, store: store, fakes: backupFakes(nil, func(f *fakes) { f.backups.InstalledFn = func(context.Context) (bool, error) { return false, nil } }),
			want: stepWant{out: Outcome{Kind: Waiting, RequeueAfter: testConfig.RetryAfter}, status: after(base), calls: []string{installedCall}}},
	})
}
