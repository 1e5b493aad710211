package controllers_test

// Every test here runs a real Velero server (internal/testenv) against the
// suite's API server, in a namespace of its own, with its own object store:
// Backups are taken by Velero, and only Velero removes them.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// veleroEnv is a memoryEnv whose store selects the Backups labelled
// app=<its namespace> in the namespace of a Velero server of its own. The
// store's namespace holds a stand-in data object, so each Backup Velero
// takes of it has files in the bucket.
type veleroEnv struct {
	*memoryEnv
	velero string
	app    string
	v      *testenv.Velero
}

func newVeleroEnv(t *testing.T, prefix string, opts ...func(*lethev1.VeleroSpec)) *veleroEnv {
	t.Helper()
	ve := &veleroEnv{velero: newNamespace(t, prefix+"-velero")}
	ve.memoryEnv = newMemoryEnvWith(t, prefix, func(e *memoryEnv) { ve.app = e.ns }, func(s *lethev1.MemoryStore) {
		s.Spec.Velero = &lethev1.VeleroSpec{Namespace: ve.velero,
			BackupSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": ve.app}},
			RotationWindow: &metav1.Duration{Duration: 720 * time.Hour},
			// Velero stamps its Backups with this host's clock, as the
			// database does its deletions: no skew to allow for, so a
			// Backup taken a moment after the deletion cannot hold it.
			ClockSkew: &metav1.Duration{Duration: time.Second}}
		for _, o := range opts {
			o(s.Spec.Velero)
		}
	})
	var err error
	if ve.v, err = testenv.StartVelero(cp.Config, testenv.VeleroOptions{Namespace: ve.velero}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Velero's log:\n%s", tail(ve.v.Log(), 4000))
		}
		ve.v.Stop()
	})
	standIn := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "memory-stand-in", Namespace: ve.app, Labels: map[string]string{"app": ve.app}},
		Data: map[string]string{"rows": "stand-in for the memory database's volume"}}
	if err := k8s.Create(context.Background(), standIn); err != nil {
		t.Fatal(err)
	}
	return ve
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// backup has Velero take a Backup of the store's namespace, labelled app,
// expiring after ttl, and waits until it completed with files in the bucket.
func (ve *veleroEnv) backup(t *testing.T, name, app string, ttl time.Duration) *velerov1.Backup {
	t.Helper()
	ctx := context.Background()
	if _, err := ve.v.TakeBackup(ctx, name, testenv.BackupOptions{Labels: map[string]string{"app": app}, Namespaces: []string{ve.app}, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	b, err := ve.v.WaitBackup(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if n := ve.files(t, name); n == 0 {
		t.Fatalf("Velero completed %s with no files in the bucket", name)
	}
	return b
}

// files counts the objects Velero keeps in the bucket for a Backup.
func (ve *veleroEnv) files(t *testing.T, name string) int {
	t.Helper()
	keys, err := ve.v.BackupFiles(name)
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

func (ve *veleroEnv) get(t *testing.T, name string) *velerov1.Backup {
	t.Helper()
	b := &velerov1.Backup{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ve.velero, Name: name}, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// deleteWithVelero asks Velero to delete Backups as `velero backup delete`
// does (a DeleteBackupRequest per Backup), for tests whose subject is not
// how the Backup goes.
func (ve *veleroEnv) deleteWithVelero(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		b := ve.get(t, n)
		if err := k8s.Create(context.Background(), &velerov1.DeleteBackupRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: n + "-", Namespace: ve.velero,
				Labels: map[string]string{velerov1.BackupNameLabel: n, velerov1.BackupUIDLabel: string(b.UID)}},
			Spec: velerov1.DeleteBackupRequestSpec{BackupName: n},
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitGone waits until Velero removed the Backup and every file of it.
func (ve *veleroEnv) waitGone(t *testing.T, timeout time.Duration, names ...string) {
	t.Helper()
	eventually(t, timeout, func() error {
		for _, n := range names {
			err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ve.velero, Name: n}, &velerov1.Backup{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("backup %s still exists (%w)", n, err)
			}
			if f := ve.files(t, n); f != 0 {
				return fmt.Errorf("backup %s: %d file(s) left in the bucket", n, f)
			}
		}
		return nil
	})
}

// deleteRequests lists the DeleteBackupRequests in the Velero namespace.
func (ve *veleroEnv) deleteRequests(t *testing.T) []velerov1.DeleteBackupRequest {
	t.Helper()
	l := &velerov1.DeleteBackupRequestList{}
	if err := k8s.List(context.Background(), l, client.InNamespace(ve.velero)); err != nil {
		t.Fatal(err)
	}
	return l.Items
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

func joinNames(bs []velerov1.DeleteBackupRequest) string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Name+"→"+b.Spec.BackupName+"("+string(b.Status.Phase)+")")
	}
	return strings.Join(out, ", ")
}
