package controllers_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// The manager starts before Velero is installed. Once Velero's CRDs appear
// it watches Backups and DeleteBackupRequests without a restart, so a
// request on the backup step completes as soon as Velero removed its Backup,
// not at the next recheck (an hour here: the test would time out waiting).
func TestBackupStepFollowsVeleroOnceItsCRDsAppear(t *testing.T) {
	ctx := context.Background()
	own := startOwnCluster(t, func(r *controllers.ErasureRequestReconciler) { r.BackupRecheck = time.Hour })
	c := own.c
	ns := newNamespaceIn(t, c, "watch")
	dsn := migratedDatabase(t)
	if err := fixture.Seed(ctx, connectVector(t, dsn), fixture.Session{ID: erasedA, Tenant: "default", Rounds: 1, Text: "x"}); err != nil {
		t.Fatal(err)
	}
	createSecretIn(t, c, ns, "pg", map[string]string{"dsn": dsn})
	store := newStore(ns, func(s *lethev1.MemoryStore) {
		s.Spec.Velero = &lethev1.VeleroSpec{BackupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": ns}},
			DeleteOnImmediate: true, ClockSkew: &metav1.Duration{Duration: time.Second}}
	})
	if err := c.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitConditionIn(t, c, store, lethev1.MemoryStoreBackupsReady, metav1.ConditionFalse, lethev1.ReasonVeleroNotInstalled)

	v, err := testenv.StartVelero(own.cp.Config, testenv.VeleroOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Stop)
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "memory-stand-in", Namespace: ns}, Data: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.TakeBackup(ctx, "nightly", testenv.BackupOptions{Labels: map[string]string{"app": ns}, Namespaces: []string{ns}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.WaitBackup(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	er := &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "forget", Namespace: ns},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: store.Name},
			SessionIDs: []lethev1.SessionID{erasedA}, Immediate: true, Reason: "R4"},
	}
	if err := c.Create(ctx, er); err != nil {
		t.Fatal(err)
	}
	waitStepReasonIn(t, c, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	waitPhaseIn(t, c, er, lethev1.PhaseBackupsRotated)
	if keys, err := v.BackupFiles("nightly"); err != nil || len(keys) != 0 {
		t.Fatalf("the request completed with %d file(s) of its Backup in the bucket (%v)", len(keys), err)
	}
}
