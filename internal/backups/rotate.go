package backups

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/label"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// What Lethe writes on Velero's objects (and AnnotationErasures, summary.go).
const (
	// AnnotationOriginalExpiration keeps the expiration a Backup had before
	// Lethe first shortened it (RFC 3339), for the evidence.
	AnnotationOriginalExpiration = "erasure.lethe.dev/original-expiration"
	// LabelRequestUID marks the DeleteBackupRequests Lethe created.
	LabelRequestUID = "erasure.lethe.dev/request-uid"
)

// Request, Scope and Backup are the erasure port's types.
type (
	Request = erasure.BackupRequest
	Scope   = erasure.BackupScope
	Backup  = erasure.Backup
)

// Rotator makes the Backups that may hold erased data expire.
type Rotator struct {
	// Client writes (patches, creates).
	Client client.Client
	// Reader reads straight from the API server: Lethe keeps no cache of
	// Velero's objects (the CRDs may be installed after the manager starts,
	// and a DeleteBackupRequest must never be created twice from a stale
	// cache).
	Reader client.Reader
	// Concurrency bounds the writes in flight.
	Concurrency int
}

// Velero is the erasure.Backups port: the Detector and the Rotator together.
type Velero struct {
	Detector
	Rotator
}

var _ erasure.Backups = Velero{}

// Holding counts the Backups of the scope that started before the deletion
// committed (give or take the scope's clock skew).
func (r Rotator) Holding(ctx context.Context, sc Scope, req Request) (int, error) {
	list, err := r.holding(ctx, sc, req)
	return len(list), err
}

// holding lists the Backups of the scope that started before the deletion,
// and those the request found before that its selector no longer lists.
func (r Rotator) holding(ctx context.Context, sc Scope, req Request) ([]velerov1.Backup, error) {
	list := &velerov1.BackupList{}
	if err := r.Reader.List(ctx, list, client.InNamespace(sc.Namespace), client.MatchingLabelsSelector{Selector: sc.Selector}); err != nil {
		return nil, fmt.Errorf("list Velero Backups in %s: %w", sc.Namespace, err)
	}
	unlisted, err := r.unlisted(ctx, sc.Namespace, req.Pending, list.Items)
	if err != nil {
		return nil, err
	}
	var out []velerov1.Backup
	for _, b := range append(list.Items, unlisted...) {
		// A Backup not started yet will read the database after the deletion.
		if st := b.Status.StartTimestamp; st != nil && sc.MayHold(st.Time, req) {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b velerov1.Backup) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// unlisted finds the pending Backups that listed does not hold: a Backup
// relabelled, or a store's selector changed, must not read as gone while
// Velero still has it. A few are read by name; more (a selector change
// leaves every pending Backup unlisted at once) by one list of the
// namespace without the selector. Only those not found are gone.
func (r Rotator) unlisted(ctx context.Context, ns string, pending []string, listed []velerov1.Backup) ([]velerov1.Backup, error) {
	var missing []string
	for _, name := range pending {
		if !slices.ContainsFunc(listed, func(b velerov1.Backup) bool { return b.Name == name }) {
			missing = append(missing, name)
		}
	}
	if len(missing) > unlistedGets {
		want := map[string]bool{}
		for _, name := range missing {
			want[name] = true
		}
		all := &velerov1.BackupList{}
		if err := r.Reader.List(ctx, all, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("list Velero Backups in %s: %w", ns, err)
		}
		return slices.DeleteFunc(all.Items, func(b velerov1.Backup) bool { return !want[b.Name] }), nil
	}
	var out []velerov1.Backup
	for _, name := range missing {
		b := velerov1.Backup{}
		err := r.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &b)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("read Velero Backup %s/%s: %w", ns, name, err)
		default:
			out = append(out, b)
		}
	}
	return out, nil
}

// unlistedGets is how many unlisted Backups are read by name; past it, one
// list of the namespace costs less.
const unlistedGets = 4

// Rotate marks every Backup that may hold the erased data, and shortens its
// expiration to the deadline (never lengthening it, never below the scope's
// MinRetention) or, for an immediate request where the scope allows it,
// creates one DeleteBackupRequest for it unless one exists. It is safe to
// repeat: a second call changes nothing.
func (r Rotator) Rotate(ctx context.Context, sc Scope, req Request) ([]Backup, error) {
	// Every write is conditional on the Backup's resource version: another
	// request rotating the same Backup at once (with another deadline) makes
	// it conflict, and the next attempt starts from what that one wrote.
	for attempt := 1; ; attempt++ {
		out, err := r.rotate(ctx, sc, req)
		if !apierrors.IsConflict(err) || attempt == 3 {
			return out, err
		}
	}
}

func (r Rotator) rotate(ctx context.Context, sc Scope, req Request) ([]Backup, error) {
	// The DeleteBackupRequests are listed before the Backups: Velero
	// deletes a Backup before the request naming it (it marks the request
	// Processed and removes it a day later), so a request gone from this
	// list means its Backup is gone from the next. The other
	// order let a pass see the Backup, then not the request Velero had
	// just finished, and ask for a second deletion (the history checker
	// found it).
	var dbrs map[string]deleteRequest
	var err error
	if sc.DeletesBackups(req) {
		if dbrs, err = r.deleteRequests(ctx, sc.Namespace); err != nil {
			return nil, err
		}
	}
	holding, err := r.holding(ctx, sc, req)
	if err != nil || len(holding) == 0 {
		return nil, err
	}
	out := make([]Backup, len(holding))
	errs := make([]error, len(holding))
	sem := make(chan struct{}, max(1, r.Concurrency))
	var wg sync.WaitGroup
	for i := range holding {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = r.rotateOne(ctx, &holding[i], sc, req, dbrs)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// rotateOne marks one Backup as holding the request's erased data and either
// shortens its expiration to the deadline or, for an immediate request the
// scope lets delete, asks Velero to delete it.
func (r Rotator) rotateOne(ctx context.Context, b *velerov1.Backup, sc Scope, req Request, dbrs map[string]deleteRequest) (Backup, error) {
	res := Backup{Name: b.Name, UID: string(b.UID), StartedAt: b.Status.StartTimestamp.Time}
	orig := b.DeepCopy()
	ann := b.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	marked := markErased(ann, req.UID, req.Deadline(), req.Recorded[b.Name])
	readExpirations(b, ann, &res)
	deletes := sc.DeletesBackups(req)
	if !deletes {
		// The floor wins over the deadline: the platform team's policy; the
		// request reports the Backups it keeps past its deadline.
		shortenExpiration(b, ann, latest(req.Deadline(), res.StartedAt.Add(sc.MinRetention)), &res)
	}
	b.SetAnnotations(ann)
	if res.Changed || marked {
		// Backup has no status subresource: one merge patch changes both.
		// Optimistic: an unconditional patch let a pass that listed the
		// Backup before another request shortened it write its own, later
		// deadline over it — lengthening the expiration.
		if err := r.Client.Patch(ctx, b, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return res, fmt.Errorf("mark Backup %s/%s: %w", b.Namespace, b.Name, err)
		}
	}
	if deletes {
		if err := r.requestDeletion(ctx, b, req, dbrs, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// readExpirations records the Backup's current expiration in res, and its
// original one: the annotation Lethe left when it first shortened it, else
// the current one.
func readExpirations(b *velerov1.Backup, ann map[string]string, res *Backup) {
	if exp := b.Status.Expiration; exp != nil {
		t := exp.Time
		res.Expiration = &t
		res.OriginalExpiration = &t
	}
	if v, ok := ann[AnnotationOriginalExpiration]; ok {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			res.OriginalExpiration = &t
		}
	}
}

// shortenExpiration sets the Backup's expiration to the deadline when it
// expires later (or never), keeping the first original expiration in an
// annotation; it never lengthens it.
func shortenExpiration(b *velerov1.Backup, ann map[string]string, deadline time.Time, res *Backup) {
	exp := b.Status.Expiration
	if exp != nil && !exp.After(deadline) {
		return
	}
	if exp != nil {
		if _, ok := ann[AnnotationOriginalExpiration]; !ok {
			ann[AnnotationOriginalExpiration] = exp.Time.UTC().Format(time.RFC3339)
		}
	}
	b.Status.Expiration = &metav1.Time{Time: deadline}
	res.Expiration = &deadline
	res.Changed = true
}

// requestDeletion records in res the DeleteBackupRequest for the Backup:
// the existing one (with Velero's errors when it was Lethe's and failed: it
// is not replaced, so a cause a human must fix is not retried blindly;
// deleting it lets Lethe ask again), else one it creates. A Backup Velero is
// still taking gets none yet (Velero refuses to delete it, and the failure
// would read as one a human must fix): the step waits for it to finish.
func (r Rotator) requestDeletion(ctx context.Context, b *velerov1.Backup, req Request, dbrs map[string]deleteRequest, res *Backup) error {
	if d, ok := dbrs[dbrKey(b.Name, string(b.UID))]; ok {
		res.DeleteRequest, res.DeleteFailed = d.name, d.failed
		return nil
	}
	if !finished(b) {
		return nil
	}
	dbr := &velerov1.DeleteBackupRequest{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    b.Namespace,
			GenerateName: generateName(b.Name),
			// The labels Velero's own garbage collector de-duplicates by.
			Labels: map[string]string{
				velerov1.BackupNameLabel: label.GetValidName(b.Name),
				velerov1.BackupUIDLabel:  string(b.UID),
				LabelRequestUID:          req.UID,
			},
		},
		Spec: velerov1.DeleteBackupRequestSpec{BackupName: b.Name},
	}
	if err := r.Client.Create(ctx, dbr); err != nil {
		return fmt.Errorf("create DeleteBackupRequest for %s/%s: %w", b.Namespace, b.Name, err)
	}
	res.DeleteRequest = dbr.Name
	res.Changed = true
	return nil
}

// finished reports whether Velero is done taking the Backup (whatever the
// outcome): only then does it process a DeleteBackupRequest for it. A
// Backup in phase Deleting is too: Velero sets that phase before it
// deletes, never takes it back when the deletion fails, and deletes a
// Backup in that phase when asked again.
func finished(b *velerov1.Backup) bool {
	switch b.Status.Phase {
	case velerov1.BackupPhaseCompleted, velerov1.BackupPhasePartiallyFailed, velerov1.BackupPhaseFailed, velerov1.BackupPhaseFailedValidation,
		velerov1.BackupPhaseDeleting:
		return true
	}
	return false
}

// deleteRequest is an existing DeleteBackupRequest: its name, and Velero's
// errors when Velero processed Lethe's request and could not delete the
// Backup.
type deleteRequest struct{ name, failed string }

// maxDeleteError bounds the Velero error text carried into a condition.
const maxDeleteError = 300

// deleteRequests maps backup (name, uid) to the DeleteBackupRequest that
// stands for it: one Velero has yet to process (anyone's: Lethe does not
// add a second), else Lethe's own that Velero failed. A failed request of
// someone else's (Velero's garbage collection, a human's `velero backup
// delete`) does not stop Lethe asking. Velero itself removes processed
// requests after a day, and the others of a Backup when it processes a new
// one: a failure stands until then.
func (r Rotator) deleteRequests(ctx context.Context, ns string) (map[string]deleteRequest, error) {
	list := &velerov1.DeleteBackupRequestList{}
	if err := r.Reader.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("list DeleteBackupRequests in %s: %w", ns, err)
	}
	out := map[string]deleteRequest{}
	for _, d := range list.Items {
		key := dbrKey(d.Spec.BackupName, d.Labels[velerov1.BackupUIDLabel])
		failed := d.Status.Phase == velerov1.DeleteBackupRequestPhaseProcessed && len(d.Status.Errors) > 0
		switch {
		case !failed:
			out[key] = deleteRequest{name: d.Name}
		case d.Labels[LabelRequestUID] == "":
			// someone else's failure: not Lethe's to report
		case out[key].name == "":
			out[key] = deleteRequest{name: d.Name, failed: boundedErrors(d.Status.Errors)}
		}
	}
	return out, nil
}

// boundedErrors joins Velero's errors, cut to maxDeleteError bytes on a
// character boundary.
func boundedErrors(errs []string) string {
	s := strings.Join(errs, "; ")
	if len(s) <= maxDeleteError {
		return s
	}
	cut := maxDeleteError
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func dbrKey(name, uid string) string { return name + "\x00" + uid }

// generateName keeps the generated name within 63 characters.
func generateName(backup string) string {
	if len(backup) > 45 {
		backup = backup[:45]
	}
	return strings.TrimRight(backup, "-.") + "-lethe-"
}
