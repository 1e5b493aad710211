package backups_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/lethe-dev/lethe/internal/backups"
)

// Edge cases of the pure logic, on controller-runtime's fake client; the
// controller tests run the same code against a real API server.
func TestRotateEdgeCases(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := velerov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deleted := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	before := &metav1.Time{Time: deleted.Add(-time.Hour)}
	longName := strings.Repeat("very-long-backup-name-", 5) + "x"
	objs := []client.Object{
		&velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "no-expiration", Namespace: "velero", Labels: map[string]string{"app": "m"}},
			Status: velerov1.BackupStatus{StartTimestamp: before}},
		&velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "not-started", Namespace: "velero", Labels: map[string]string{"app": "m"}}},
		&velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: longName, Namespace: "velero", Labels: map[string]string{"app": "m"}, UID: "u1"},
			Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted, StartTimestamp: before}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	r := backups.Rotator{Client: c, Reader: c, Concurrency: 2}
	sc := backups.Scope{Namespace: "velero", Selector: labels.SelectorFromSet(labels.Set{"app": "m"})}
	req := backups.Request{UID: "r1", Namespace: "team", Name: "forget", DeletedAt: deleted, Window: 24 * time.Hour}

	got, err := r.Rotate(context.Background(), sc, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d backups held, want 2 (a backup not started yet holds nothing): %+v", len(got), got)
	}
	b := &velerov1.Backup{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "velero", Name: "no-expiration"}, b); err != nil {
		t.Fatal(err)
	}
	if b.Status.Expiration == nil || !b.Status.Expiration.Equal(&metav1.Time{Time: req.Deadline()}) {
		t.Fatalf("a Backup without expiration got %v, want the deadline %s", b.Status.Expiration, req.Deadline())
	}
	if _, ok := b.Annotations[backups.AnnotationOriginalExpiration]; ok {
		t.Fatal("an original expiration was recorded for a Backup that had none")
	}

	req.Immediate = true
	sc.DeleteOnImmediate = true
	if _, err := r.Rotate(context.Background(), sc, req); err != nil {
		t.Fatal(err)
	}
	dbrs := &velerov1.DeleteBackupRequestList{}
	if err := c.List(context.Background(), dbrs); err != nil {
		t.Fatal(err)
	}
	for _, d := range dbrs.Items {
		if d.Spec.BackupName != longName {
			continue
		}
		if errs := validation.IsValidLabelValue(d.Labels[velerov1.BackupNameLabel]); len(errs) > 0 {
			t.Errorf("backup-name label of a long name is not a valid label value: %v", errs)
		}
		// The API server appends 5 characters to generateName.
		if len(d.GenerateName)+5 > validation.DNS1123LabelMaxLength {
			t.Errorf("generateName %q makes a name longer than 63 characters", d.GenerateName)
		}
		return
	}
	t.Fatalf("no DeleteBackupRequest for the long-named Backup: %+v", dbrs.Items)
}

// Two requests rotate the same Backup at once: the one with the later
// deadline listed it before the other shortened it, and writes after. Its
// write must not lengthen the expiration the other set; it conflicts,
// starts again from the other's write, and keeps the earlier deadline.
func TestConcurrentRotationsNeverLengthen(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := velerov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deleted := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	base := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "velero", Labels: map[string]string{"app": "m"}},
			Status: velerov1.BackupStatus{StartTimestamp: &metav1.Time{Time: deleted.Add(-time.Hour)},
				Expiration: &metav1.Time{Time: deleted.Add(90 * 24 * time.Hour)}}}).Build()
	sc := backups.Scope{Namespace: "velero", Selector: labels.SelectorFromSet(labels.Set{"app": "m"})}
	early := backups.Request{UID: "early", Namespace: "team", Name: "a", DeletedAt: deleted, Window: time.Hour}
	late := backups.Request{UID: "late", Namespace: "team", Name: "b", DeletedAt: deleted.Add(30 * time.Minute), Window: time.Hour}

	// The late request's first write lets the early request run to the end first.
	interleaved := false
	c := interceptor.NewClient(base, interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if !interleaved {
			interleaved = true
			if _, err := (backups.Rotator{Client: base, Reader: base}).Rotate(ctx, sc, early); err != nil {
				return err
			}
		}
		return cl.Patch(ctx, obj, patch, opts...)
	}})
	if _, err := (backups.Rotator{Client: c, Reader: c}).Rotate(context.Background(), sc, late); err != nil {
		t.Fatal(err)
	}
	if !interleaved {
		t.Fatal("the interleaving did not happen")
	}
	b := &velerov1.Backup{}
	if err := base.Get(context.Background(), client.ObjectKey{Namespace: "velero", Name: "nightly"}, b); err != nil {
		t.Fatal(err)
	}
	if !b.Status.Expiration.Time.Equal(early.Deadline()) {
		t.Errorf("expiration %s, want the earlier deadline %s (never lengthened)", b.Status.Expiration.Time, early.Deadline())
	}
	if s := backups.ReadSummary(b.Annotations); s.Count != 2 || s.RequestsDigest != backups.RequestsDigest([]string{"early", "late"}) {
		t.Errorf("the Backup's summary does not count both requests: %v", b.Annotations)
	}
}

// A Backup that started shortly after the deletion committed, by Velero's
// clock, may have read the database before the commit by the database's:
// within the scope's clock skew it counts as holding the data.
func TestClockSkewMargin(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := velerov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deleted := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	started := func(name string, at time.Time) client.Object {
		return &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "velero"},
			Status: velerov1.BackupStatus{StartTimestamp: &metav1.Time{Time: at}}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		started("before", deleted.Add(-time.Second)),
		started("within-skew", deleted.Add(4*time.Minute)),
		started("after-skew", deleted.Add(6*time.Minute))).Build()
	r := backups.Rotator{Client: c, Reader: c}
	req := backups.Request{UID: "u", DeletedAt: deleted, Window: time.Hour}
	for skew, want := range map[time.Duration]int{0: 1, 5 * time.Minute: 2, time.Hour: 3} {
		sc := backups.Scope{Namespace: "velero", Selector: labels.Everything(), ClockSkew: skew}
		if n, err := r.Holding(context.Background(), sc, req); err != nil || n != want {
			t.Errorf("skew %s: %d Backups holding (%v), want %d", skew, n, err, want)
		}
	}
}

// Lethe's DeleteBackupRequest that Velero processed with errors is reported
// with its error and not replaced; a newer one, pending, wins over it; with
// none left, Lethe asks again. Someone else's failed request does not stop
// Lethe asking; a Backup Velero is still taking gets none yet.
func TestFailedDeleteRequestIsReportedNotReplaced(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := velerov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deleted := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	failed := &velerov1.DeleteBackupRequest{ObjectMeta: metav1.ObjectMeta{Name: "failed", Namespace: "velero",
		Labels: map[string]string{velerov1.BackupUIDLabel: "u1", backups.LabelRequestUID: "r"}},
		Spec:   velerov1.DeleteBackupRequestSpec{BackupName: "nightly"},
		Status: velerov1.DeleteBackupRequestStatus{Phase: velerov1.DeleteBackupRequestPhaseProcessed, Errors: []string{"location is read-only", strings.Repeat("x", 400)}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(failed,
		&velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "velero", UID: "u1", Labels: map[string]string{"app": "m"}},
			Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted, StartTimestamp: &metav1.Time{Time: deleted.Add(-time.Hour)}}},
		&velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "taking", Namespace: "velero", UID: "u2", Labels: map[string]string{"app": "m"}},
			Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseInProgress, StartTimestamp: &metav1.Time{Time: deleted.Add(-time.Minute)}}}).Build()
	sc := backups.Scope{Namespace: "velero", Selector: labels.SelectorFromSet(labels.Set{"app": "m"}), DeleteOnImmediate: true}
	req := backups.Request{UID: "r", Namespace: "team", Name: "a", Immediate: true, DeletedAt: deleted, Window: time.Hour}
	r := backups.Rotator{Client: c, Reader: c}
	ctx := context.Background()
	got, err := r.Rotate(ctx, sc, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].DeleteRequest != "failed" || !strings.HasPrefix(got[0].DeleteFailed, "location is read-only; ") || len(got[0].DeleteFailed) > 310 {
		t.Fatalf("got %+v: want the failed request named with Velero's error, bounded", got)
	}
	if got[1].Name != "taking" || got[1].DeleteRequest != "" || got[1].DeleteFailed != "" {
		t.Fatalf("got %+v: a Backup Velero is still taking gets no DeleteBackupRequest yet", got[1])
	}
	dbrs := &velerov1.DeleteBackupRequestList{}
	if err := c.List(ctx, dbrs); err != nil || len(dbrs.Items) != 1 {
		t.Fatalf("%d DeleteBackupRequests (%v): the failed one was replaced", len(dbrs.Items), err)
	}
	pending := failed.DeepCopy()
	pending.Name, pending.ResourceVersion, pending.Status = "pending", "", velerov1.DeleteBackupRequestStatus{}
	if err := c.Create(ctx, pending); err != nil {
		t.Fatal(err)
	}
	if got, err = r.Rotate(ctx, sc, req); err != nil || got[0].DeleteRequest != "pending" || got[0].DeleteFailed != "" {
		t.Fatalf("got %+v (%v): the pending request wins over the failed one", got, err)
	}
	for _, d := range []*velerov1.DeleteBackupRequest{failed, pending} {
		if err := c.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	// Velero's garbage collection failed its own request: Lethe still asks.
	gcFailed := failed.DeepCopy()
	gcFailed.Name, gcFailed.ResourceVersion = "gc-failed", ""
	delete(gcFailed.Labels, backups.LabelRequestUID)
	if err := c.Create(ctx, gcFailed); err != nil {
		t.Fatal(err)
	}
	if got, err = r.Rotate(ctx, sc, req); err != nil || got[0].DeleteRequest == "" || got[0].DeleteFailed != "" || !got[0].Changed {
		t.Fatalf("got %+v (%v): with the failed request deleted, Lethe asks again", got, err)
	}
}

// A Backup the request found before and the selector no longer lists (its
// labels changed) still holds the data: it is found by name and rotated;
// one not found by name is gone.
func TestABackupRelabelledIsStillHeld(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := velerov1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deleted := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	backup := func(name, app string) *velerov1.Backup {
		return &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "velero", Labels: map[string]string{"app": app}},
			Status: velerov1.BackupStatus{StartTimestamp: &metav1.Time{Time: deleted.Add(-time.Hour)},
				Expiration: &metav1.Time{Time: deleted.Add(90 * 24 * time.Hour)}}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(backup("listed", "m"), backup("relabelled", "archive"), backup("never-found", "archive")).Build()
	r := backups.Rotator{Client: c, Reader: c}
	sc := backups.Scope{Namespace: "velero", Selector: labels.SelectorFromSet(labels.Set{"app": "m"})}
	req := backups.Request{UID: "r1", Namespace: "team", Name: "forget", DeletedAt: deleted, Window: time.Hour,
		Recorded: map[string]bool{"listed": true, "relabelled": true, "deleted": true},
		Pending:  []string{"listed", "relabelled", "deleted"}}

	// A few unlisted Backups are read by name, more by one list of the
	// namespace: both find the same.
	for _, gone := range [][]string{nil, {"gone-1", "gone-2", "gone-3", "gone-4"}} {
		req := req
		req.Pending = append(slices.Clone(req.Pending), gone...)
		got, err := r.Rotate(context.Background(), sc, req)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, b := range got {
			names = append(names, b.Name)
		}
		if strings.Join(names, ",") != "listed,relabelled" {
			t.Fatalf("%d pending: Backups held: %v, want listed and relabelled (deleted is gone; never-found was never the store's)", len(req.Pending), names)
		}
	}
	b := &velerov1.Backup{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "velero", Name: "relabelled"}, b); err != nil {
		t.Fatal(err)
	}
	if !b.Status.Expiration.Time.Equal(req.Deadline()) {
		t.Errorf("the relabelled Backup expires at %s, want the deadline %s", b.Status.Expiration, req.Deadline())
	}
}
