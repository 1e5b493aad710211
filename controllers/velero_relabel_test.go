package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A Backup relabelled while the request waits for it to expire — a platform
// team moving Backups out of the store's selector — still holds the erased
// data: the request does not read it as gone while Velero has it; it
// completes once Velero's garbage collection removed it, files and all, at
// the expiration the request set.
func TestABackupRelabelledWhileExpiringIsNotReadAsGone(t *testing.T) {
	const window = 45 * time.Second
	ctx := context.Background()
	ve := newVeleroEnv(t, "relabel", func(v *lethev1.VeleroSpec) { v.RotationWindow = &metav1.Duration{Duration: window} })
	ve.backup(t, "nightly-1", ve.app, 90*day)
	er := ve.request(t, "forget", notImmediate)
	waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	deadline := ve.deletedAt(t, er).Add(window).Truncate(time.Second)

	b := ve.get(t, "nightly-1")
	orig := b.DeepCopy()
	b.Labels["app"] = "archive"
	if err := k8s.Patch(ctx, b, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	if !b.Status.Expiration.Time.Equal(deadline) {
		t.Fatalf("nightly-1 expires at %s, want the request's deadline %s", b.Status.Expiration, deadline)
	}
	// Each pass after the relabelling (the step rechecks every second here)
	// must see it held until Velero removed it.
	eventually(t, window+2*time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if er.Status.Phase != lethev1.PhaseBackupsRotated {
			return fmt.Errorf("phase %s", er.Status.Phase)
		}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ve.velero, Name: "nightly-1"}, &velerov1.Backup{})
		if !apierrors.IsNotFound(err) || ve.files(t, "nightly-1") != 0 {
			t.Fatalf("the request completed while nightly-1 exists (%v) with %d file(s) in the bucket", err, ve.files(t, "nightly-1"))
		}
		return nil
	})
	ev := stepEvidence(t, er, lethev1.ConditionBackupsRotated)
	if len(ev.Backups) != 1 || ev.Backups[0].GoneAt == nil || ev.Backups[0].GoneAt.Time.Before(deadline) {
		t.Fatalf("evidence %+v: want nightly-1 gone at its expiration %s or after", ev.Backups, deadline)
	}
}
