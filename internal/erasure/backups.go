package erasure

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// BackupRotation is step 5: every Velero Backup that started before the
// deletion committed, and so may hold the erased sessions, is made to
// expire: its expiration is shortened to the deletion plus the store's
// rotationWindow (an immediate request asks Velero to delete it now). The
// step is done when none of them exists any more; it requeues at the next
// expiration, bounded by BackupRecheck.
type BackupRotation struct{ Config Config }

// Name is the step's condition type.
func (BackupRotation) Name() string { return lethev1.ConditionBackupsRotated }

func (b BackupRotation) Run(ctx context.Context, s *Scope) Outcome {
	if s.isTrue(lethev1.ConditionBackupsRotated) {
		return Outcome{Kind: Done}
	}
	if s.Backups == nil {
		return notConfigured(s, lethev1.ConditionBackupsRotated, "no Velero backups are configured for this store")
	}
	sc, req, blocked := b.scope(ctx, s)
	if blocked != nil {
		return *blocked
	}
	if req.DeletedAt.IsZero() {
		out := done(lethev1.ConditionBackupsRotated, lethev1.ReasonNoSessionsFound, "the request erased no session: no backup holds its data")
		out.Milestone = &Milestone{Phase: lethev1.PhaseBackupsRotated, Event: lethev1.ReasonNoSessionsFound, At: s.Clock.Now(),
			Evidence: map[string]int{"backups": 0}, Note: "no backup to rotate"}
		return out
	}
	found, err := s.Backups.Rotate(ctx, sc, req)
	if err != nil {
		return failed(b.Config, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring,
			"the Velero Backups could not be updated; Lethe retries", err)
	}
	now := s.Clock.Now()
	entries := mergeBackups(RecordedBackups(s.Request), found, now)
	remaining := slices.DeleteFunc(slices.Clone(entries), func(e lethev1.BackupEvidence) bool { return e.GoneAt != nil })
	ev := backupEvidence(lethev1.ConditionBackupsRotated, entries, sc, req)
	if len(remaining) == 0 {
		out := done(lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsGone, "no Velero Backup that started before the deletion remains")
		out.Evidence, out.Work = &ev, Work{Backups: found}
		out.Milestone = &Milestone{Phase: lethev1.PhaseBackupsRotated, At: now, Evidence: ev, Note: ev.Note}
		return out
	}
	if out, failed := deletionFailed(b.Config, found); failed {
		out.Evidence, out.Work = &ev, Work{Backups: found}
		return out
	}
	earliest, latest := expirationRange(remaining)
	msg := fmt.Sprintf("%d Velero Backup(s) that may hold the erased sessions remain", len(remaining))
	switch {
	case sc.DeletesBackups(req):
		if taking := stillTaken(found); taking > 0 {
			msg += fmt.Sprintf("; a DeleteBackupRequest was created for each Velero has finished taking, and %d still being taken will get one when done", taking)
		} else {
			msg += "; a DeleteBackupRequest was created for each"
		}
	case earliest != nil:
		msg += fmt.Sprintf("; they expire between %s and %s", earliest.UTC().Format(time.RFC3339), latest.UTC().Format(time.RFC3339))
	}
	if kept := keptPastDeadline(remaining, req.Deadline()); kept > 0 && !sc.DeletesBackups(req) {
		msg += fmt.Sprintf("; %d kept past the request's deadline %s by the store's velero.minRetention", kept, req.Deadline().UTC().Format(time.RFC3339))
	}
	wait := b.Config.BackupRecheck
	if sc.DeletesBackups(req) {
		// Velero processes a DeleteBackupRequest within seconds; the watch
		// brings the pass, this is the backstop.
		wait = min(wait, deleteRecheck)
	}
	if earliest != nil {
		if until := earliest.Sub(now); until > 0 {
			wait = min(wait, until+time.Second)
		}
	}
	expiring := waiting(wait, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring, msg)
	expiring.Evidence, expiring.Work = &ev, Work{Backups: found}
	return expiring
}

// scope resolves the store's Velero scope and the request's deletion time,
// or the outcome of what stands in the way.
func (b BackupRotation) scope(ctx context.Context, s *Scope) (BackupScope, BackupRequest, *Outcome) {
	installed, err := s.Backups.Installed(ctx)
	if err != nil || !installed {
		out := waiting(b.Config.RetryAfter, lethev1.ConditionBackupsRotated, lethev1.ReasonVeleroNotInstalled,
			"Velero's CRDs (velero.io/v1 Backup and DeleteBackupRequest) are not served; the request waits and goes on once they are installed")
		if err != nil {
			out.Kind, out.Err = Errored, err
		}
		return BackupScope{}, BackupRequest{}, &out
	}
	sc, err := backupScope(s.Store)
	if err != nil {
		out := waiting(b.Config.BackupRecheck, lethev1.ConditionBackupsRotated, lethev1.ReasonInvalidSpec,
			"the store's velero.backupSelector is invalid: "+err.Error())
		return BackupScope{}, BackupRequest{}, &out
	}
	deletedAt, err := s.Ledger.DeletedAt(ctx, s.uid())
	if err != nil {
		out := failed(b.Config, lethev1.ConditionBackupsRotated, lethev1.ReasonDatabaseUnavailable,
			"the erasure ledger could not be read; Lethe retries", err)
		return BackupScope{}, BackupRequest{}, &out
	}
	er := s.Request
	recorded := map[string]bool{}
	var pending []string
	for _, b := range RecordedBackups(er) {
		recorded[b.Name] = true
		if b.GoneAt == nil {
			pending = append(pending, b.Name)
		}
	}
	return sc, BackupRequest{UID: string(er.UID), Namespace: er.Namespace, Name: er.Name, Immediate: er.Spec.Immediate,
		DeletedAt: deletedAt, Window: s.Store.Spec.Velero.RotationWindowOrDefault(), Recorded: recorded, Pending: pending}, nil
}

// Reverify catches a Backup that came back (re-synced from its bucket with
// its original, later expiration) after the step completed, shortens it
// again (or asks for its deletion) and records it.
func (b BackupRotation) Reverify(ctx context.Context, s *Scope) Outcome {
	if s.Backups == nil || s.reason(lethev1.ConditionBackupsRotated) != lethev1.ReasonBackupsGone {
		return Outcome{Kind: Done}
	}
	sc, req, blocked := b.scope(ctx, s)
	if blocked != nil {
		// The completed step's condition stays; the re-verification retries.
		if blocked.Err != nil {
			return errored(blocked.Err)
		}
		return Outcome{Kind: Waiting, RequeueAfter: blocked.RequeueAfter}
	}
	if req.DeletedAt.IsZero() {
		return Outcome{Kind: Done}
	}
	found, err := s.Backups.Rotate(ctx, sc, req)
	if err != nil {
		return errored(err)
	}
	var changed []Backup
	for _, bk := range found {
		if bk.Changed {
			changed = append(changed, bk)
		}
	}
	if len(changed) == 0 {
		return Outcome{Kind: Done, Work: Work{Backups: found}}
	}
	ev := backupEvidence(lethev1.ReasonResurrected, mergeBackups(nil, changed, s.Clock.Now()), sc, req)
	ev.Note = fmt.Sprintf("%d Velero Backup(s) holding erased data reappeared (re-synced from their bucket?) and were made to expire again", len(changed))
	return Outcome{Kind: Done, Evidence: &ev, Work: Work{Backups: found},
		Milestone: &Milestone{Phase: s.Request.Status.Phase, Event: lethev1.ReasonResurrected, At: s.Clock.Now(), Evidence: ev, Note: ev.Note},
		Warning: &Warning{Reason: lethev1.ReasonResurrected, Action: "Rotate",
			Note: fmt.Sprintf("%d Velero Backup(s) holding erased data reappeared and were made to expire again", len(changed))},
	}
}

// deleteRecheck bounds the wait of a request whose Backups Velero was asked
// to delete.
const deleteRecheck = 30 * time.Second

// stillTaken counts the Backups found without a DeleteBackupRequest: Velero
// is still taking them.
func stillTaken(found []Backup) int {
	n := 0
	for _, bk := range found {
		if bk.DeleteRequest == "" {
			n++
		}
	}
	return n
}

// deletionFailed is the step waiting on a human when Velero failed a
// DeleteBackupRequest: the condition names the Backup, the request and
// Velero's error, and the step rechecks without asking Velero again.
func deletionFailed(cfg Config, found []Backup) (Outcome, bool) {
	var failed []Backup
	for _, bk := range found {
		if bk.DeleteFailed != "" {
			failed = append(failed, bk)
		}
	}
	if len(failed) == 0 {
		return Outcome{}, false
	}
	f := failed[0]
	msg := fmt.Sprintf("Velero could not delete %d Backup(s); Backup %s (DeleteBackupRequest %s): %s. Fix the cause, then delete the failed DeleteBackupRequest and Lethe asks Velero again",
		len(failed), f.Name, f.DeleteRequest, f.DeleteFailed)
	return stalled(cfg.BackupRecheck, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupDeletionFailed, msg), true
}

// keptPastDeadline counts the Backups set to expire after the deadline (a
// retention floor).
func keptPastDeadline(entries []lethev1.BackupEvidence, deadline time.Time) int {
	n := 0
	for _, e := range entries {
		if e.Expiration != nil && e.Expiration.After(deadline.Truncate(time.Second)) {
			n++
		}
	}
	return n
}

// backupScope is the store's Velero namespace and Backup selector.
func backupScope(store *lethev1.MemoryStore) (BackupScope, error) {
	v := store.Spec.Velero
	sel, err := metav1.LabelSelectorAsSelector(&v.BackupSelector)
	if err != nil {
		return BackupScope{}, err
	}
	return BackupScope{Namespace: v.NamespaceOrDefault(), Selector: sel, DeleteOnImmediate: v.DeleteOnImmediate,
		MinRetention: v.MinRetentionOrZero(), ClockSkew: v.ClockSkewOrDefault()}, nil
}

// RecordedBackups are the Backups the backup step recorded in the evidence.
func RecordedBackups(er *lethev1.ErasureRequest) []lethev1.BackupEvidence {
	if er.Status.Evidence == nil {
		return nil
	}
	for _, st := range er.Status.Evidence.Steps {
		if st.Step == lethev1.ConditionBackupsRotated {
			return st.Backups
		}
	}
	return nil
}

// mergeBackups updates the recorded Backups with what was found now; a
// recorded Backup not found any more is gone from now on.
func mergeBackups(prev []lethev1.BackupEvidence, found []Backup, now time.Time) []lethev1.BackupEvidence {
	byName := map[string]lethev1.BackupEvidence{}
	for _, b := range prev {
		byName[b.Name] = b
	}
	present := map[string]bool{}
	for _, f := range found {
		present[f.Name] = true
		byName[f.Name] = mergeBackup(byName[f.Name], f)
	}
	out := make([]lethev1.BackupEvidence, 0, len(byName))
	for name, e := range byName {
		if !present[name] && e.GoneAt == nil {
			e.GoneAt = mtime(now)
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b lethev1.BackupEvidence) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func mergeBackup(e lethev1.BackupEvidence, f Backup) lethev1.BackupEvidence {
	e.Name = f.Name
	e.StartedAt = mtime(f.StartedAt)
	if e.OriginalExpiration == nil && f.OriginalExpiration != nil {
		e.OriginalExpiration = mtime(*f.OriginalExpiration)
	}
	if f.Expiration != nil {
		e.Expiration = mtime(*f.Expiration)
	}
	if f.DeleteRequest != "" {
		e.DeleteBackupRequest = f.DeleteRequest
	}
	e.GoneAt = nil
	return e
}

func backupEvidence(step string, entries []lethev1.BackupEvidence, sc BackupScope, req BackupRequest) lethev1.StepEvidence {
	var shortened, deleteRequests, gone int64
	for _, e := range entries {
		if e.Expiration != nil && (e.OriginalExpiration == nil || e.Expiration.Before(e.OriginalExpiration)) {
			shortened++
		}
		if e.DeleteBackupRequest != "" {
			deleteRequests++
		}
		if e.GoneAt != nil {
			gone++
		}
	}
	ev := lethev1.StepEvidence{Step: step, StartedAt: mtime(req.DeletedAt), Backups: entries,
		Counts: []lethev1.TableCount{
			{Table: "Velero Backups started before the deletion", Rows: int64(len(entries))},
			{Table: "expirations shortened", Rows: shortened},
			{Table: "DeleteBackupRequests created", Rows: deleteRequests},
			{Table: "Backups gone", Rows: gone},
		},
		Verification: []lethev1.Verification{{Check: "Velero Backups that started before the deletion and still exist", Found: int64(len(entries)) - gone}},
		Note: fmt.Sprintf("%d Backup(s) may hold the erased sessions (started before the deletion committed, or up to the store's velero.clockSkew %s after); each expires by %s at the latest (deletion + rotationWindow %s)",
			len(entries), sc.ClockSkew, req.Deadline().UTC().Format(time.RFC3339), req.Window),
	}
	switch {
	case sc.DeletesBackups(req):
		ev.Note = fmt.Sprintf("%d Backup(s) may hold the erased sessions; immediate: a DeleteBackupRequest asks Velero to delete each now", len(entries))
	case req.Immediate:
		ev.Note += "; immediate, but the store's velero.deleteOnImmediate is off: shortened, not deleted"
	}
	if sc.MinRetention > 0 {
		ev.Note += fmt.Sprintf("; never before its start + the store's velero.minRetention %s", sc.MinRetention)
	}
	if len(entries) > 1000 {
		ev.Backups = entries[:1000]
		ev.Note += "; the first 1000 are listed"
	}
	return ev
}

func expirationRange(bs []lethev1.BackupEvidence) (earliest, latest *time.Time) {
	for _, b := range bs {
		if b.Expiration == nil {
			continue
		}
		t := b.Expiration.Time
		if earliest == nil || t.Before(*earliest) {
			earliest = &t
		}
		if latest == nil || t.After(*latest) {
			latest = &t
		}
	}
	return earliest, latest
}
