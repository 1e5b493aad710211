package controllers_test

// The suite's control plane has Velero's CRDs installed from the start.

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
)

// veleroEnv is a memoryEnv whose store selects the Backups labelled
// app=<its namespace> in a Velero namespace of its own.
type veleroEnv struct {
	*memoryEnv
	velero string
	app    string
}

func newVeleroEnv(t *testing.T, prefix string, opts ...func(*lethev1.VeleroSpec)) *veleroEnv {
	t.Helper()
	ve := &veleroEnv{velero: newNamespace(t, prefix+"-velero")}
	ve.memoryEnv = newMemoryEnvWith(t, prefix, func(e *memoryEnv) { ve.app = e.ns }, func(s *lethev1.MemoryStore) {
		s.Spec.Velero = &lethev1.VeleroSpec{Namespace: ve.velero,
			BackupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": ve.app}},
			RotationWindow: &metav1.Duration{Duration: 720 * time.Hour}}
		for _, o := range opts {
			o(s.Spec.Velero)
		}
	})
	return ve
}

// backup creates a Backup as Velero would have left it (the CRD has no
// status subresource, so the status is written with the object).
func (ve *veleroEnv) backup(t *testing.T, name, app string, started time.Time, expires time.Time) *velerov1.Backup {
	t.Helper()
	b := &velerov1.Backup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ve.velero, Labels: map[string]string{"app": app}},
		Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted,
			StartTimestamp: &metav1.Time{Time: started}, Expiration: &metav1.Time{Time: expires}},
	}
	if err := k8s.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return b
}

func (ve *veleroEnv) get(t *testing.T, name string) *velerov1.Backup {
	t.Helper()
	b := &velerov1.Backup{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ve.velero, Name: name}, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func (ve *veleroEnv) remove(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := k8s.Delete(context.Background(), &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ve.velero}}); err != nil {
			t.Fatal(err)
		}
	}
}

// deletedAt is the deletion's commit by the database's clock.
func (ve *veleroEnv) deletedAt(t *testing.T, er *lethev1.ErasureRequest) time.Time {
	t.Helper()
	var at time.Time
	if err := ve.conn.QueryRow(context.Background(), `SELECT max(erased_at) FROM lethe.erasure_ledger WHERE request_uid = $1`, string(er.UID)).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

func TestBackupsThatMayHoldErasedDataAreShortenedUntilGone(t *testing.T) {
	ve := newVeleroEnv(t, "rotate")
	now := time.Now()
	longLived := now.Add(90 * 24 * time.Hour).Truncate(time.Second)
	soon := now.Add(time.Hour).Truncate(time.Second)
	ve.backup(t, "nightly-1", ve.app, now.Add(-2*time.Hour), longLived)
	ve.backup(t, "nightly-2", ve.app, now.Add(-3*time.Hour), soon) // already expires before the window ends
	ve.backup(t, "other-store", "someone-else", now.Add(-2*time.Hour), longLived)

	er := ve.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Millisecond}
	})
	c := waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	if !strings.HasPrefix(c.Message, "2 Velero Backup(s)") {
		t.Fatalf("condition message %q", c.Message)
	}
	// Taken after the deletion, beyond the store's clockSkew (5m by
	// default): cannot hold the erased sessions.
	ve.backup(t, "after-deletion", ve.app, time.Now().Add(10*time.Minute), longLived)

	deadline := ve.deletedAt(t, er).Add(720 * time.Hour).Truncate(time.Second)
	marked := func(b *velerov1.Backup, deadline string) bool {
		s := backups.ReadSummary(b.Annotations)
		return s.Count == 1 && s.EarliestDeadline == deadline && s.RequestsDigest == backups.RequestsDigest([]string{string(er.UID)})
	}
	eventually(t, 10*time.Second, func() error {
		b := ve.get(t, "nightly-1")
		if !b.Status.Expiration.Time.Equal(deadline) || !marked(b, deadline.UTC().Format(time.RFC3339)) || strings.Contains(fmt.Sprint(b.Annotations), "forget") ||
			b.Annotations[backups.AnnotationOriginalExpiration] != longLived.UTC().Format(time.RFC3339) {
			return fmt.Errorf("nightly-1: expiration %s (want %s), annotations %v", b.Status.Expiration, deadline, b.Annotations)
		}
		return nil
	})
	if b := ve.get(t, "nightly-2"); !b.Status.Expiration.Time.Equal(soon) || !marked(b, deadline.UTC().Format(time.RFC3339)) {
		t.Fatalf("nightly-2 (expires earlier than the window): expiration %s, want %s unchanged; annotations %v", b.Status.Expiration, soon, b.Annotations)
	}
	for _, n := range []string{"other-store", "after-deletion"} {
		if b := ve.get(t, n); !b.Status.Expiration.Time.Equal(longLived) || len(b.Annotations) != 0 {
			t.Fatalf("%s was changed: expiration %s, annotations %v", n, b.Status.Expiration, b.Annotations)
		}
	}
	// Not done while they exist (the backup step rechecks every second here).
	time.Sleep(2 * time.Second)
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
		t.Fatal(err)
	}
	if er.Status.Phase == lethev1.PhaseBackupsRotated {
		t.Fatal("BackupsRotated while the Backups still exist")
	}

	ve.remove(t, "nightly-1", "nightly-2") // what Velero's garbage collector does at expiration
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	ev := stepEvidence(t, er, lethev1.ConditionBackupsRotated)
	if len(ev.Backups) != 2 {
		t.Fatalf("evidence lists %d backups, want 2: %+v", len(ev.Backups), ev.Backups)
	}
	for _, b := range ev.Backups {
		if b.GoneAt == nil || b.StartedAt == nil || b.Expiration == nil || b.OriginalExpiration == nil {
			t.Errorf("evidence of %s is incomplete: %+v", b.Name, b)
		}
	}
	if b := ev.Backups[0]; b.Name != "nightly-1" || !b.OriginalExpiration.Time.Equal(longLived) || !b.Expiration.Time.Equal(deadline) {
		t.Errorf("evidence of nightly-1: %+v", b)
	}

	// Velero re-syncs nightly-1 from its bucket with its original expiration:
	// the re-verification shortens it again and the history records it.
	ve.backup(t, "nightly-1", ve.app, now.Add(-2*time.Hour), longLived)
	waitHistoryEntry(t, er, string(lethev1.PhaseBackupsRotated)+"/"+lethev1.ReasonResurrected)
	if b := ve.get(t, "nightly-1"); !b.Status.Expiration.Time.Equal(deadline) {
		t.Fatalf("re-synced nightly-1 expires %s, want %s", b.Status.Expiration, deadline)
	}
	assertNoPersonalData(t, er)
}

func TestImmediateRequestsAskVeleroToDeleteEachBackupOnce(t *testing.T) {
	ve := newVeleroEnv(t, "immediate-backups", func(v *lethev1.VeleroSpec) { v.DeleteOnImmediate = true })
	now := time.Now()
	for _, n := range []string{"hourly-1", "hourly-2"} {
		ve.backup(t, n, ve.app, now.Add(-time.Hour), now.Add(30*24*time.Hour))
	}
	er := ve.request(t, "forget", nil)
	waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)

	// A restarted manager (nothing in memory) and several passes: still one
	// DeleteBackupRequest per Backup.
	scope := backups.Scope{Namespace: ve.velero, Selector: mustSelector(t, "app="+ve.app), DeleteOnImmediate: true}
	req := backups.Request{UID: string(er.UID), Namespace: er.Namespace, Name: er.Name, Immediate: true, DeletedAt: ve.deletedAt(t, er), Window: time.Hour}
	restarted := backups.Rotator{Client: k8s, Reader: k8s, Concurrency: 4}
	for i := 0; i < 3; i++ {
		if _, err := restarted.Rotate(context.Background(), scope, req); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // the manager's own passes, every second
	dbrs := &velerov1.DeleteBackupRequestList{}
	if err := k8s.List(context.Background(), dbrs, client.InNamespace(ve.velero)); err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, d := range dbrs.Items {
		per[d.Spec.BackupName]++
		if d.Labels[velerov1.BackupNameLabel] != d.Spec.BackupName || d.Labels[velerov1.BackupUIDLabel] == "" {
			t.Errorf("DeleteBackupRequest %s lacks Velero's labels: %v", d.Name, d.Labels)
		}
	}
	if per["hourly-1"] != 1 || per["hourly-2"] != 1 || len(dbrs.Items) != 2 {
		t.Fatalf("DeleteBackupRequests per backup: %v (%d in all), want exactly one each", per, len(dbrs.Items))
	}
	ve.remove(t, "hourly-1", "hourly-2") // Velero processed the requests
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
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
	now := time.Now()
	ve.backup(t, "nightly", ve.app, now.Add(-time.Hour), now.Add(48*time.Hour))
	ve.backup(t, "later", ve.app, now.Add(time.Hour), now.Add(48*time.Hour))
	ve.backup(t, "other-app", "someone-else", now.Add(-time.Hour), now.Add(48*time.Hour))
	er := ve.request(t, "plan", func(er *lethev1.ErasureRequest) { er.Spec.DryRun = true })
	waitPhase(t, er, lethev1.PhasePlanned)
	got := &lethev1.ErasureRequest{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Plan == nil || got.Status.Plan.Backups != 1 {
		t.Fatalf("plan %+v: want 1 Backup (nightly)", got.Status.Plan)
	}
	for _, name := range []string{"nightly", "later", "other-app"} {
		b := ve.get(t, name)
		if len(b.Annotations) != 0 || !b.Status.Expiration.Time.Equal(now.Add(48*time.Hour).Truncate(time.Second)) {
			t.Errorf("a dry run changed Backup %s: annotations %v, expiration %s", name, b.Annotations, b.Status.Expiration)
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
	now := time.Now().Truncate(time.Second)
	ve.backup(t, "shared-nightly", ve.app, now.Add(-time.Hour), now.Add(90*24*time.Hour))
	er := ve.request(t, "forget", nil)
	if !er.Spec.Immediate {
		t.Fatal("the request is not immediate")
	}
	c := waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	if !strings.Contains(c.Message, "minRetention") {
		t.Errorf("the condition does not say the floor keeps the Backup past the deadline: %q", c.Message)
	}
	time.Sleep(2 * time.Second) // more of the manager's passes, every second
	dbrs := &velerov1.DeleteBackupRequestList{}
	if err := k8s.List(context.Background(), dbrs, client.InNamespace(ve.velero)); err != nil {
		t.Fatal(err)
	}
	if len(dbrs.Items) != 0 {
		t.Fatalf("%d DeleteBackupRequest(s) created without deleteOnImmediate", len(dbrs.Items))
	}
	want := now.Add(-time.Hour).Add(floor)
	if b := ve.get(t, "shared-nightly"); !b.Status.Expiration.Time.Equal(want) || backups.ReadSummary(b.Annotations).Count != 1 {
		t.Fatalf("expiration %s, want the floor %s (the deadline is earlier); annotations %v", b.Status.Expiration, want, b.Annotations)
	}
}

// 5,000 requests rotating one Backup on a real API server: its annotations
// stay one bounded summary that counts each request once.
func TestFiveThousandRequestsKeepABackupsAnnotationsBounded(t *testing.T) {
	const requests = 5000
	ctx := context.Background()
	ns := newNamespace(t, "many-requests-velero")
	started := time.Now().Add(-time.Hour).Truncate(time.Second)
	b := &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "shared-nightly", Namespace: ns, Labels: map[string]string{"app": "memory"}},
		Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted, StartTimestamp: &metav1.Time{Time: started},
			Expiration: &metav1.Time{Time: started.Add(90 * 24 * time.Hour)}}}
	if err := k8s.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	r := backups.Rotator{Client: k8s, Reader: k8s, Concurrency: 1}
	sc := backups.Scope{Namespace: ns, Selector: mustSelector(t, "app=memory")}
	uids := make([]string, requests)
	for i := range requests {
		uids[i] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		req := backups.Request{UID: uids[i], Namespace: "team", Name: fmt.Sprintf("forget-person-%d", i), DeletedAt: time.Now(), Window: 720 * time.Hour}
		if _, err := r.Rotate(ctx, sc, req); err != nil {
			t.Fatalf("rotation %d: %v", i, err)
		}
	}
	got := getBackup(t, ns, "shared-nightly")
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

func getBackup(t *testing.T, ns, name string) *velerov1.Backup {
	t.Helper()
	b := &velerov1.Backup{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, b); err != nil {
		t.Fatal(err)
	}
	return b
}
