package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/backups"
	"github.com/lethe-dev/lethe/internal/metrics"
)

// +kubebuilder:rbac:groups=velero.io,resources=backups,verbs=get;list;patch
// +kubebuilder:rbac:groups=velero.io,resources=deletebackuprequests,verbs=get;list;create

// backups makes every Velero Backup that started before the deletion
// committed, and so may hold the erased sessions, expire: its expiration is
// shortened to the deletion plus the store's rotationWindow (an immediate
// request asks Velero to delete it now). The step is done when none of
// them exists any more; it requeues at the next expiration, bounded by
// BackupRecheck.
func (r *ErasureRequestReconciler) backups(ctx context.Context, s *scope) (bool, error) {
	er := s.req
	if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionBackupsRotated) {
		return true, nil
	}
	if s.store.Spec.Velero == nil {
		return r.notConfigured(s, lethev1.ConditionBackupsRotated, "no Velero backups are configured for this store")
	}
	sc, req, f, err := r.backupScope(ctx, s)
	if f != nil {
		r.setStep(s, lethev1.ConditionBackupsRotated, false, f.reason, f.message)
		s.result = ctrl.Result{RequeueAfter: r.RetryAfter}
		if f.reason == lethev1.ReasonInvalidSpec {
			s.result = ctrl.Result{RequeueAfter: r.BackupRecheck}
		}
		return false, err
	}
	if req.DeletedAt.IsZero() {
		r.setStep(s, lethev1.ConditionBackupsRotated, true, lethev1.ReasonNoSessionsFound, "the request erased no session: no backup holds its data")
		r.milestone(s, lethev1.PhaseBackupsRotated, lethev1.ReasonNoSessionsFound, r.Clock.Now(), map[string]int{"backups": 0}, "no backup to rotate")
		return true, nil
	}
	found, err := r.Rotator.Rotate(ctx, sc, req)
	if err != nil {
		r.setStep(s, lethev1.ConditionBackupsRotated, false, lethev1.ReasonBackupsExpiring, "the Velero Backups could not be updated; Lethe retries: "+err.Error())
		return false, err
	}
	countBackupWork(found)
	now := r.Clock.Now()
	entries := mergeBackups(previousBackups(er), found, now)
	remaining := slices.DeleteFunc(slices.Clone(entries), func(b lethev1.BackupEvidence) bool { return b.GoneAt != nil })
	ev := backupEvidence(lethev1.ConditionBackupsRotated, entries, req)
	setEvidence(&er.Status, ev)
	if len(remaining) == 0 {
		r.setStep(s, lethev1.ConditionBackupsRotated, true, lethev1.ReasonBackupsGone,
			"no Velero Backup that started before the deletion remains")
		r.milestone(s, lethev1.PhaseBackupsRotated, "", now, ev, ev.Note)
		return true, nil
	}
	earliest, latest := expirationRange(remaining)
	msg := fmt.Sprintf("%d Velero Backup(s) that may hold the erased sessions remain", len(remaining))
	switch {
	case req.Immediate:
		msg += "; a DeleteBackupRequest was created for each"
	case earliest != nil:
		msg += fmt.Sprintf("; they expire between %s and %s", earliest.UTC().Format(time.RFC3339), latest.UTC().Format(time.RFC3339))
	}
	r.setStep(s, lethev1.ConditionBackupsRotated, false, lethev1.ReasonBackupsExpiring, msg)
	wait := r.BackupRecheck
	if earliest != nil {
		if until := earliest.Sub(now); until > 0 && until < wait {
			wait = until + time.Second
		}
	}
	s.result = ctrl.Result{RequeueAfter: wait}
	return false, nil
}

// backupScope resolves the store's Velero scope and the request's deletion
// time. It only reports what stands in the way: the step turns that into
// its condition, while a re-verification of a completed request must not
// (a completed step stays completed; the re-verification retries).
func (r *ErasureRequestReconciler) backupScope(ctx context.Context, s *scope) (backups.Scope, backups.Request, *failure, error) {
	v := s.store.Spec.Velero
	installed, err := r.Velero.Installed(ctx)
	if err != nil || !installed {
		return backups.Scope{}, backups.Request{}, fail(lethev1.ReasonVeleroNotInstalled,
			"Velero's CRDs (velero.io/v1 Backup and DeleteBackupRequest) are not served; the request waits and goes on once they are installed"), err
	}
	sel, err := metav1.LabelSelectorAsSelector(&v.BackupSelector)
	if err != nil {
		return backups.Scope{}, backups.Request{}, fail(lethev1.ReasonInvalidSpec, "the store's velero.backupSelector is invalid: %v", err), nil
	}
	deletedAt, err := s.eraser.DeletedAt(ctx, string(s.req.UID))
	if err != nil {
		return backups.Scope{}, backups.Request{}, fail(lethev1.ReasonDatabaseUnavailable, "the erasure ledger could not be read: %v", err), err
	}
	ns := v.Namespace
	if ns == "" {
		ns = "velero"
	}
	window := 720 * time.Hour
	if v.RotationWindow != nil {
		window = v.RotationWindow.Duration
	}
	return backups.Scope{Namespace: ns, Selector: sel},
		backups.Request{UID: string(s.req.UID), Namespace: s.req.Namespace, Name: s.req.Name, Immediate: s.req.Spec.Immediate, DeletedAt: deletedAt, Window: window},
		nil, nil
}

// reverifyBackups catches a Backup that came back (re-synced from its
// bucket with its original, later expiration) after the step completed,
// shortens it again (or asks for its deletion) and records it.
func (r *ErasureRequestReconciler) reverifyBackups(ctx context.Context, s *scope) error {
	if s.store.Spec.Velero == nil {
		return nil
	}
	if c := meta.FindStatusCondition(s.req.Status.Conditions, lethev1.ConditionBackupsRotated); c == nil || c.Reason != lethev1.ReasonBackupsGone {
		return nil
	}
	sc, req, f, err := r.backupScope(ctx, s)
	if err != nil {
		return err
	}
	if f != nil {
		return errors.New(f.message)
	}
	if req.DeletedAt.IsZero() {
		return nil
	}
	found, err := r.Rotator.Rotate(ctx, sc, req)
	if err != nil {
		return err
	}
	countBackupWork(found)
	var changed []backups.Backup
	for _, b := range found {
		if b.Changed {
			changed = append(changed, b)
		}
	}
	if len(changed) == 0 {
		return nil
	}
	ev := backupEvidence(lethev1.ReasonResurrected, mergeBackups(nil, changed, r.Clock.Now()), req)
	ev.Note = fmt.Sprintf("%d Velero Backup(s) holding erased data reappeared (re-synced from their bucket?) and were made to expire again", len(changed))
	setEvidence(&s.req.Status, ev)
	r.Recorder.Eventf(s.req, nil, corev1.EventTypeWarning, lethev1.ReasonResurrected, "Rotate", "%d Velero Backup(s) holding erased data reappeared and were made to expire again", len(changed))
	r.milestone(s, s.req.Status.Phase, lethev1.ReasonResurrected, r.Clock.Now(), ev, ev.Note)
	return nil
}

func previousBackups(er *lethev1.ErasureRequest) []lethev1.BackupEvidence {
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
func mergeBackups(prev []lethev1.BackupEvidence, found []backups.Backup, now time.Time) []lethev1.BackupEvidence {
	byName := map[string]lethev1.BackupEvidence{}
	for _, b := range prev {
		byName[b.Name] = b
	}
	present := map[string]bool{}
	for _, f := range found {
		present[f.Name] = true
		e := byName[f.Name]
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
		byName[f.Name] = e
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

func backupEvidence(step string, entries []lethev1.BackupEvidence, req backups.Request) lethev1.StepEvidence {
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
		Note: fmt.Sprintf("%d Backup(s) may hold the erased sessions; each expires by %s at the latest (deletion + rotationWindow %s)",
			len(entries), req.Deadline().UTC().Format(time.RFC3339), req.Window),
	}
	if req.Immediate {
		ev.Note = fmt.Sprintf("%d Backup(s) may hold the erased sessions; immediate: a DeleteBackupRequest asks Velero to delete each now", len(entries))
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

func countBackupWork(found []backups.Backup) {
	for _, b := range found {
		switch {
		case !b.Changed:
		case b.DeleteRequest != "":
			metrics.BackupWork.WithLabelValues("delete_requested").Inc()
		default:
			metrics.BackupWork.WithLabelValues("shortened").Inc()
		}
	}
}
