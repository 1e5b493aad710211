package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Velero fails a deletion after it has set the Backup's phase to Deleting
// (a Restore of the Backup that does not go: a finalizer nobody removes,
// so Velero's wait for it times out), and never sets the phase back. Once
// the operator has removed the cause and the failed DeleteBackupRequest,
// Lethe asks again for the Backup left Deleting, and Velero deletes it.
func TestBackupLeftDeletingByAFailedDeletionIsAskedForAgain(t *testing.T) {
	ctx := context.Background()
	ve := newVeleroEnv(t, "left-deleting", func(v *lethev1.VeleroSpec) { v.DeleteOnImmediate = true })
	ve.backup(t, "hourly", ve.app, 30*day)
	held := &velerov1.Restore{
		ObjectMeta: metav1.ObjectMeta{Namespace: ve.velero, Name: "hourly-held", Finalizers: []string{"test.lethe.dev/hold"}},
		Spec:       velerov1.RestoreSpec{BackupName: "hourly"},
		Status:     velerov1.RestoreStatus{Phase: velerov1.RestorePhaseCompleted},
	}
	if err := k8s.Create(ctx, held); err != nil {
		t.Fatal(err)
	}

	er := ve.request(t, "forget", nil)
	// Velero waits a minute for the Restore to go before it fails.
	eventually(t, 3*time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionBackupsRotated); c == nil || c.Reason != lethev1.ReasonBackupDeletionFailed {
			return fmt.Errorf("BackupsRotated %+v, want the failed deletion", c)
		}
		return nil
	})
	b := &velerov1.Backup{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ve.velero, Name: "hourly"}, b); err != nil || b.Status.Phase != velerov1.BackupPhaseDeleting {
		t.Fatalf("Backup after the failed deletion: phase %q (%v), want Deleting: the case this test is about did not happen", b.Status.Phase, err)
	}

	if err := k8s.Get(ctx, client.ObjectKeyFromObject(held), held); err != nil {
		t.Fatal(err)
	}
	held.Finalizers = nil
	if err := k8s.Update(ctx, held); err != nil {
		t.Fatal(err)
	}
	for _, d := range ve.deleteRequests(t) {
		if err := k8s.Delete(ctx, &d); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	ve.waitGone(t, time.Minute, "hourly")
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
}
