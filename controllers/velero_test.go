package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/backups"
	"github.com/lethe-dev/lethe/internal/testenv"
)

const day = 24 * time.Hour

// notImmediate makes a request that waits out a (tiny) grace period.
func notImmediate(er *lethev1.ErasureRequest) {
	er.Spec.Immediate, er.Spec.Reason = false, ""
	er.Spec.GracePeriod = &metav1.Duration{Duration: time.Millisecond}
}

// waitPhaseWithin is waitPhase with a longer wait, for a step that ends
// when Velero's garbage collection runs.
func waitPhaseWithin(t *testing.T, er *lethev1.ErasureRequest, phase lethev1.Phase, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if er.Status.Phase != phase {
			return fmt.Errorf("phase %q, want %q; conditions %s", er.Status.Phase, phase, conditionsString(er.Status.Conditions))
		}
		return nil
	})
}

// Backups Velero took before the deletion are shortened to the deadline,
// Velero's own garbage collection removes them and their files at that
// expiration, and only then is the step done. A Backup of another store, one
// taken after the deletion and one that already expires sooner are left as
// they are.
func TestBackupsThatMayHoldErasedDataAreShortenedUntilGone(t *testing.T) {
	const window = 60 * time.Second
	ve := newVeleroEnv(t, "rotate", func(v *lethev1.VeleroSpec) { v.RotationWindow = &metav1.Duration{Duration: window} })
	nightly1 := ve.backup(t, "nightly-1", ve.app, 90*day)
	nightly2 := ve.backup(t, "nightly-2", ve.app, 45*time.Second) // expires before the window ends
	other := ve.backup(t, "other-store", "someone-else", 90*day)

	er := ve.request(t, "forget", notImmediate)
	c := waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	if !strings.HasPrefix(c.Message, "2 Velero Backup(s)") {
		t.Fatalf("condition message %q", c.Message)
	}
	// Past the store's clockSkew (1s), and a second more: Velero stamps
	// starts to the second, so one started within the second after the
	// skew reads as inside it (and Lethe rightly counts it).
	time.Sleep(3 * time.Second)
	after := ve.backup(t, "after-deletion", ve.app, 90*day)

	deadline := ve.deletedAt(t, er).Add(window).Truncate(time.Second)
	marked := func(b *velerov1.Backup) bool {
		s := backups.ReadSummary(b.Annotations)
		return s.Count == 1 && s.EarliestDeadline == deadline.UTC().Format(time.RFC3339) &&
			s.RequestsDigest == backups.RequestsDigest([]string{string(er.UID)})
	}
	b := ve.get(t, "nightly-1")
	if !b.Status.Expiration.Time.Equal(deadline) || !marked(b) || strings.Contains(fmt.Sprint(b.Annotations), "forget") ||
		b.Annotations[backups.AnnotationOriginalExpiration] != nightly1.Status.Expiration.UTC().Format(time.RFC3339) {
		t.Fatalf("nightly-1: expiration %s (want %s), annotations %v", b.Status.Expiration, deadline, b.Annotations)
	}
	if b := ve.get(t, "nightly-2"); !b.Status.Expiration.Equal(nightly2.Status.Expiration) || !marked(b) {
		t.Fatalf("nightly-2 (expires before the deadline): expiration %s, want %s unchanged; annotations %v", b.Status.Expiration, nightly2.Status.Expiration, b.Annotations)
	}
	for _, want := range []*velerov1.Backup{other, after} {
		if b := ve.get(t, want.Name); !b.Status.Expiration.Equal(want.Status.Expiration) || backups.ReadSummary(b.Annotations).Count != 0 {
			t.Fatalf("%s was changed: expiration %s, annotations %v", want.Name, b.Status.Expiration, b.Annotations)
		}
	}
	// Not done while nightly-1 and its files exist.
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
		t.Fatal(err)
	}
	if er.Status.Phase == lethev1.PhaseBackupsRotated || ve.files(t, "nightly-1") == 0 {
		t.Fatalf("phase %s with nightly-1's %d file(s) in the bucket", er.Status.Phase, ve.files(t, "nightly-1"))
	}

	waitPhaseWithin(t, er, lethev1.PhaseBackupsRotated, window+time.Minute)
	// Velero deletes the files before the object: gone when the step is done.
	for _, n := range []string{"nightly-1", "nightly-2"} {
		if f := ve.files(t, n); f != 0 {
			t.Errorf("the request completed with %d file(s) of %s in the bucket", f, n)
		}
	}
	for _, n := range []string{"other-store", "after-deletion"} {
		if f := ve.files(t, n); f == 0 {
			t.Errorf("%s lost its files", n)
		}
	}
	ev := stepEvidence(t, er, lethev1.ConditionBackupsRotated)
	if len(ev.Backups) != 2 {
		t.Fatalf("evidence lists %d backups, want 2: %+v", len(ev.Backups), ev.Backups)
	}
	for _, b := range ev.Backups {
		if b.GoneAt == nil || b.StartedAt == nil || b.Expiration == nil || b.OriginalExpiration == nil {
			t.Errorf("evidence of %s is incomplete: %+v", b.Name, b)
		}
	}
	if b := ev.Backups[0]; b.Name != "nightly-1" || !b.OriginalExpiration.Equal(nightly1.Status.Expiration) || !b.Expiration.Time.Equal(deadline) ||
		b.GoneAt.Time.Before(deadline) {
		t.Errorf("evidence of nightly-1: %+v; want it gone at its new expiration %s or after (Velero's garbage collection)", b, deadline)
	}
	assertNoPersonalData(t, er)
}

// A cluster rebuilt for disaster recovery: the Backup object is deleted with
// its files left in the bucket, so the request completes; Velero re-syncs
// the Backup from the bucket with its original expiration; the
// re-verification shortens it again and records it, and Velero's garbage
// collection then removes the files.
func TestBackupResyncedFromItsBucketIsShortenedAgain(t *testing.T) {
	const window = 20 * time.Second
	ve := newVeleroEnv(t, "resync", func(v *lethev1.VeleroSpec) { v.RotationWindow = &metav1.Duration{Duration: window} })
	nightly := ve.backup(t, "nightly", ve.app, 90*day)
	er := ve.request(t, "forget", notImmediate)
	waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	deadline := ve.deletedAt(t, er).Add(window).Truncate(time.Second)

	if err := k8s.Delete(context.Background(), ve.get(t, "nightly")); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	if f := ve.files(t, "nightly"); f == 0 {
		t.Fatal("the bucket lost the Backup's files with its object")
	}
	if err := ve.v.Restart(); err != nil { // a redeployed Velero syncs its bucket at once
		t.Fatal(err)
	}
	waitHistoryEntry(t, er, string(lethev1.PhaseBackupsRotated)+"/"+lethev1.ReasonResurrected)
	last := er.Status.History[len(er.Status.History)-1]
	if last.Event != lethev1.ReasonResurrected {
		t.Fatalf("last history entry %s/%s", last.Phase, last.Event)
	}
	var resurrected *lethev1.StepEvidence
	for i, st := range er.Status.Evidence.Steps {
		if st.Step == lethev1.ReasonResurrected {
			resurrected = &er.Status.Evidence.Steps[i]
		}
	}
	if resurrected == nil || len(resurrected.Backups) != 1 || !resurrected.Backups[0].Expiration.Time.Equal(deadline) ||
		!resurrected.Backups[0].OriginalExpiration.Equal(nightly.Status.Expiration) {
		t.Fatalf("Resurrected evidence %+v: want nightly, from its original expiration %s to %s", resurrected, nightly.Status.Expiration, deadline)
	}
	ve.waitGone(t, time.Minute, "nightly")
}

// An immediate request on a store with deleteOnImmediate asks Velero to
// delete each Backup with one DeleteBackupRequest, however many passes and
// restarts see it before Velero acts (here Velero is down meanwhile);
// Velero deletes the Backups and their files and cleans the requests up.
func TestImmediateRequestsAskVeleroToDeleteEachBackupOnce(t *testing.T) {
	ve := newVeleroEnv(t, "immediate-backups", func(v *lethev1.VeleroSpec) { v.DeleteOnImmediate = true })
	for _, n := range []string{"hourly-1", "hourly-2"} {
		ve.backup(t, n, ve.app, 30*day)
	}
	ve.v.StopServer()
	er := ve.request(t, "forget", nil)
	waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	eventually(t, 30*time.Second, func() error {
		if dbrs := ve.deleteRequests(t); len(dbrs) != 2 {
			return fmt.Errorf("the manager created DeleteBackupRequests %s, want one per Backup", joinNames(dbrs))
		}
		return nil
	})

	// A restarted manager (nothing in memory) and several passes: still one
	// DeleteBackupRequest per Backup.
	scope := backups.Scope{Namespace: ve.velero, Selector: mustSelector(t, "app="+ve.app), DeleteOnImmediate: true, ClockSkew: time.Second}
	req := backups.Request{UID: string(er.UID), Namespace: er.Namespace, Name: er.Name, Immediate: true, DeletedAt: ve.deletedAt(t, er), Window: time.Hour}
	restarted := backups.Rotator{Client: k8s, Reader: k8s, Concurrency: 4}
	for range 3 {
		if _, err := restarted.Rotate(context.Background(), scope, req); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // the manager's own passes, every second
	dbrs := ve.deleteRequests(t)
	per := map[string]int{}
	for _, d := range dbrs {
		per[d.Spec.BackupName]++
		if d.Labels[velerov1.BackupNameLabel] != d.Spec.BackupName || d.Labels[velerov1.BackupUIDLabel] == "" {
			t.Errorf("DeleteBackupRequest %s lacks Velero's labels: %v", d.Name, d.Labels)
		}
	}
	if per["hourly-1"] != 1 || per["hourly-2"] != 1 || len(dbrs) != 2 {
		t.Fatalf("DeleteBackupRequests per backup: %v (%s), want exactly one each", per, joinNames(dbrs))
	}

	if err := ve.v.StartServer(); err != nil {
		t.Fatal(err)
	}
	ve.waitGone(t, time.Minute, "hourly-1", "hourly-2")
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	eventually(t, 30*time.Second, func() error {
		if left := ve.deleteRequests(t); len(left) != 0 {
			return fmt.Errorf("Velero left its processed DeleteBackupRequests: %s", joinNames(left))
		}
		return nil
	})
	ev := stepEvidence(t, er, lethev1.ConditionBackupsRotated)
	for _, b := range ev.Backups {
		if b.DeleteBackupRequest == "" || b.GoneAt == nil {
			t.Errorf("evidence of %s: %+v", b.Name, b)
		}
	}
	if !meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionReady) {
		t.Fatal("not Ready after BackupsRotated")
	}
}

// Velero fails a DeleteBackupRequest (its storage location is read-only):
// the request says so with Velero's reason and does not ask again while the
// failed request stands; once the operator fixes the location and deletes
// the failed request, Lethe asks again and Velero deletes the Backup.
func TestVeleroFailingADeletionIsSurfacedNotRetriedBlindly(t *testing.T) {
	ctx := context.Background()
	ve := newVeleroEnv(t, "dbr-fails", func(v *lethev1.VeleroSpec) { v.DeleteOnImmediate = true })
	ve.backup(t, "hourly", ve.app, 30*day)
	setAccessMode(t, ve, velerov1.BackupStorageLocationAccessModeReadOnly)

	er := ve.request(t, "forget", nil)
	c := waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupDeletionFailed)
	if !strings.Contains(c.Message, "read-only") || !strings.Contains(c.Message, "hourly") {
		t.Fatalf("condition message %q: want Velero's reason and the Backup", c.Message)
	}
	if stalled := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionStalled); stalled == nil ||
		stalled.Status != metav1.ConditionTrue || stalled.Reason != lethev1.ReasonBackupDeletionFailed {
		t.Errorf("Stalled %+v: want True/BackupDeletionFailed (a human must act)", stalled)
	}
	time.Sleep(3 * time.Second) // several of the manager's passes
	dbrs := ve.deleteRequests(t)
	if len(dbrs) != 1 || len(dbrs[0].Status.Errors) == 0 {
		t.Fatalf("DeleteBackupRequests %s: want the one failed request, not a retry", joinNames(dbrs))
	}
	if f := ve.files(t, "hourly"); f == 0 {
		t.Fatal("the files went although Velero failed the deletion")
	}

	setAccessMode(t, ve, velerov1.BackupStorageLocationAccessModeReadWrite)
	if err := k8s.Delete(ctx, &dbrs[0]); err != nil {
		t.Fatal(err)
	}
	ve.waitGone(t, time.Minute, "hourly")
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
}

func setAccessMode(t *testing.T, ve *veleroEnv, mode velerov1.BackupStorageLocationAccessMode) {
	t.Helper()
	bsl := &velerov1.BackupStorageLocation{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ve.velero, Name: "default"}, bsl); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(bsl.DeepCopy())
	bsl.Spec.AccessMode = mode
	if err := k8s.Patch(context.Background(), bsl, patch); err != nil {
		t.Fatal(err)
	}
}

// A Backup Velero is still taking (phase InProgress) when the deletion
// commits may hold the data. Shortened: it is shortened like a finished one,
// Velero finishing it keeps Lethe's expiration, and garbage collection
// removes it. Deleted (deleteOnImmediate): Lethe asks for its deletion once
// Velero has finished it (Velero refuses to delete a Backup in progress), and
// the request does not stall on a human meanwhile.
func TestBackupInProgressAtTheDeletionHoldsTheData(t *testing.T) {
	t.Run("Shortened", func(t *testing.T) { testBackupInProgress(t, false) })
	t.Run("DeleteOnImmediate", func(t *testing.T) { testBackupInProgress(t, true) })
}

func testBackupInProgress(t *testing.T, deletes bool) {
	ctx := context.Background()
	const window = 30 * time.Second
	ve := newVeleroEnv(t, "in-progress", func(v *lethev1.VeleroSpec) {
		v.RotationWindow, v.DeleteOnImmediate = &metav1.Duration{Duration: window}, deletes
	})
	if err := ve.v.PauseObjectStore(); err != nil { // the upload stalls: the Backup stays InProgress
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := ve.v.ResumeObjectStore(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(resume)
	started, err := ve.v.TakeBackup(ctx, "nightly", velerovBackupOptions(ve, 90*day))
	if err != nil {
		t.Fatal(err)
	}
	mutate := notImmediate
	if deletes {
		mutate = nil
	}
	er := ve.request(t, "forget", mutate)
	c := waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	deadline := ve.deletedAt(t, er).Add(window).Truncate(time.Second)
	b := ve.get(t, "nightly")
	if b.Status.Phase != velerov1.BackupPhaseInProgress {
		t.Fatalf("the Backup is %s, not InProgress, when the step ran: the test shows nothing", b.Status.Phase)
	}
	if backups.ReadSummary(b.Annotations).Count != 1 || !b.Status.StartTimestamp.Equal(started.Status.StartTimestamp) {
		t.Fatalf("the in-progress Backup was not marked as holding the data: %v", b.Annotations)
	}
	if deletes {
		time.Sleep(2 * time.Second) // several passes while Velero is still taking it
		if dbrs := ve.deleteRequests(t); len(dbrs) != 0 || !strings.Contains(c.Message, "still being taken") {
			t.Fatalf("DeleteBackupRequests %s for a Backup in progress (condition %q)", joinNames(dbrs), c.Message)
		}
	} else if !b.Status.Expiration.Time.Equal(deadline) {
		t.Fatalf("in-progress Backup: expiration %s, want %s", b.Status.Expiration, deadline)
	}
	resume()
	if !deletes { // (deleted, it may be gone before a poll sees it finished)
		done, err := ve.v.WaitBackup(ctx, "nightly")
		if err != nil {
			t.Fatal(err)
		}
		if !done.Status.Expiration.Time.Equal(deadline) {
			t.Fatalf("Velero finished the Backup with expiration %s, want Lethe's %s", done.Status.Expiration, deadline)
		}
	}
	waitPhaseWithin(t, er, lethev1.PhaseBackupsRotated, window+time.Minute)
	if f := ve.files(t, "nightly"); f != 0 {
		t.Fatalf("%d file(s) of the Backup left", f)
	}
	if st := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionBackupsRotated); st.Reason != lethev1.ReasonBackupsGone {
		t.Fatalf("BackupsRotated %s", st.Reason)
	}
}

func velerovBackupOptions(ve *veleroEnv, ttl time.Duration) testenv.BackupOptions {
	return testenv.BackupOptions{Labels: map[string]string{"app": ve.app}, Namespaces: []string{ve.app}, TTL: ttl}
}

func mustSelector(t *testing.T, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// A dry run's plan counts the Backups the backup step would rotate (the
// store's, started before the plan) and touches none of them.
func TestDryRunPlansTheBackupStep(t *testing.T) {
	ve := newVeleroEnv(t, "velero-plan")
	nightly := ve.backup(t, "nightly", ve.app, 2*day)
	other := ve.backup(t, "other-app", "someone-else", 2*day)
	// Queued while Velero is down: not started, it will read the database
	// after any deletion.
	ve.v.StopServer()
	queued := &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: ve.velero, Labels: map[string]string{"app": ve.app}},
		Spec: velerov1.BackupSpec{IncludedNamespaces: []string{ve.app}}}
	if err := k8s.Create(context.Background(), queued); err != nil {
		t.Fatal(err)
	}
	er := ve.request(t, "plan", func(er *lethev1.ErasureRequest) { er.Spec.DryRun = true })
	waitPhase(t, er, lethev1.PhasePlanned)
	got := &lethev1.ErasureRequest{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Plan == nil || got.Status.Plan.Backups != 1 {
		t.Fatalf("plan %+v: want 1 Backup (nightly; not the other application's, not the queued one)", got.Status.Plan)
	}
	if b := ve.get(t, "queued"); len(b.Annotations) != 0 {
		t.Errorf("a dry run annotated the queued Backup: %v", b.Annotations)
	}
	for _, want := range []*velerov1.Backup{nightly, other} {
		b := ve.get(t, want.Name)
		if backups.ReadSummary(b.Annotations).Count != 0 || !b.Status.Expiration.Equal(want.Status.Expiration) {
			t.Errorf("a dry run changed Backup %s: annotations %v, expiration %s", want.Name, b.Annotations, b.Status.Expiration)
		}
	}
}

// A store that does not allow it (deleteOnImmediate, off by default): an
// immediate request creates no DeleteBackupRequest — the Backup may hold
// other tenants' data — and shortens the Backup like any request; the
// store's retention floor holds it past the deadline, and the request says so.
func TestImmediateWithoutDeleteOnImmediateOnlyShortens(t *testing.T) {
	const floor = 1000 * time.Hour
	ve := newVeleroEnv(t, "immediate-shortens", func(v *lethev1.VeleroSpec) { v.MinRetention = &metav1.Duration{Duration: floor} })
	shared := ve.backup(t, "shared-nightly", ve.app, 90*day)
	er := ve.request(t, "forget", nil)
	if !er.Spec.Immediate {
		t.Fatal("the request is not immediate")
	}
	c := waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	if !strings.Contains(c.Message, "minRetention") {
		t.Errorf("the condition does not say the floor keeps the Backup past the deadline: %q", c.Message)
	}
	time.Sleep(2 * time.Second) // more of the manager's passes, every second
	if dbrs := ve.deleteRequests(t); len(dbrs) != 0 {
		t.Fatalf("DeleteBackupRequest(s) created without deleteOnImmediate: %s", joinNames(dbrs))
	}
	want := shared.Status.StartTimestamp.Add(floor)
	if b := ve.get(t, "shared-nightly"); !b.Status.Expiration.Time.Equal(want) || backups.ReadSummary(b.Annotations).Count != 1 {
		t.Fatalf("expiration %s, want the floor %s (the deadline is earlier); annotations %v", b.Status.Expiration, want, b.Annotations)
	}
	if f := ve.files(t, "shared-nightly"); f == 0 {
		t.Fatal("the Backup's files are gone")
	}
}

// 5,000 requests rotating one real Backup: its annotations stay one bounded
// summary that counts each request once.
func TestFiveThousandRequestsKeepABackupsAnnotationsBounded(t *testing.T) {
	const requests = 5000
	ctx := context.Background()
	ve := newVeleroEnv(t, "many-requests")
	ve.backup(t, "shared-nightly", ve.app, 90*day)
	r := backups.Rotator{Client: k8s, Reader: k8s, Concurrency: 1}
	sc := backups.Scope{Namespace: ve.velero, Selector: mustSelector(t, "app="+ve.app), ClockSkew: time.Second}
	uids := make([]string, requests)
	for i := range requests {
		uids[i] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		req := backups.Request{UID: uids[i], Namespace: "team", Name: fmt.Sprintf("forget-person-%d", i), DeletedAt: time.Now(), Window: 720 * time.Hour}
		if _, err := r.Rotate(ctx, sc, req); err != nil {
			t.Fatalf("rotation %d: %v", i, err)
		}
	}
	got := ve.get(t, "shared-nightly")
	size := 0
	for k, v := range got.Annotations {
		size += len(k) + len(v)
	}
	s := backups.ReadSummary(got.Annotations)
	if size > 4096 || s.Count != requests || s.RequestsDigest != backups.RequestsDigest(uids) {
		t.Fatalf("after %d requests: annotations of %d bytes, summary count %d, digest matches %v", requests, size, s.Count, s.RequestsDigest == backups.RequestsDigest(uids))
	}
	t.Logf("%d requests: the Backup's annotations take %d bytes", requests, size)
}
