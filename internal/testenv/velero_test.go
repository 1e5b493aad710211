package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/internal/testenv"
)

// The Velero behaviours Lethe's backup step relies on, observed on the real
// server: a Backup's files land in the bucket; garbage collection removes
// the Backup and its files once its expiration passes; a
// DeleteBackupRequest removes them at once and is removed itself; a Backup
// object deleted with its files left in the bucket comes back on sync with
// its original expiration.
func TestVeleroBehavesAsLetheAssumes(t *testing.T) {
	ctx := context.Background()
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	v, err := testenv.StartVelero(cp.Config, testenv.VeleroOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Stop)
	c := v.Client()
	data := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "memory"}}
	if err := c.Create(ctx, data); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "stand-in", Namespace: "memory"}, Data: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	take := func(name string) *velerov1.Backup {
		t.Helper()
		if _, err := v.TakeBackup(ctx, name, testenv.BackupOptions{Namespaces: []string{"memory"}}); err != nil {
			t.Fatal(err)
		}
		b, err := v.WaitBackup(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if n := files(t, v, name); n == 0 {
			t.Fatalf("backup %s completed with no files in the bucket", name)
		}
		return b
	}
	gc, dbr, resync := take("gc"), take("dbr"), take("resync")

	// Garbage collection, about a second after the expiration passes.
	patch := client.MergeFrom(gc.DeepCopy())
	gc.Status.Expiration = &metav1.Time{Time: time.Now().Add(time.Second)}
	if err := c.Patch(ctx, gc, patch); err != nil {
		t.Fatal(err)
	}
	waitGone(t, v, "gc")

	// A DeleteBackupRequest.
	req, err := v.DeleteBackup(ctx, "dbr")
	if err != nil {
		t.Fatal(err)
	}
	if req == nil || req.Labels[velerov1.BackupUIDLabel] != string(dbr.UID) {
		t.Fatalf("DeleteBackup of an existing Backup (uid %s) made %+v", dbr.UID, req)
	}
	waitGone(t, v, "dbr")
	if again, err := v.DeleteBackup(ctx, "dbr"); err != nil || again != nil {
		t.Fatalf("DeleteBackup of a Backup already gone: %+v, %v; want neither a request nor an error", again, err)
	}
	eventually(t, 30*time.Second, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(req), req); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the processed DeleteBackupRequest is still there (phase %s, error %w)", req.Status.Phase, err)
		}
		return nil
	})

	// Only the object deleted: the bucket brings it back on the next sync.
	if err := c.Delete(ctx, resync); err != nil {
		t.Fatal(err)
	}
	if err := v.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		got := &velerov1.Backup{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(resync), got); err != nil {
			return err
		}
		if got.UID == resync.UID || !got.Status.Expiration.Equal(resync.Status.Expiration) {
			return fmt.Errorf("re-synced with UID %s (was %s), expiration %s (was %s)", got.UID, resync.UID, got.Status.Expiration, resync.Status.Expiration)
		}
		return nil
	})
	if n := files(t, v, "resync"); n == 0 {
		t.Fatal("the re-synced backup has no files")
	}
}

func files(t *testing.T, v *testenv.Velero, backup string) int {
	t.Helper()
	keys, err := v.BackupFiles(backup)
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// waitGone waits until the Backup object and every file of it are gone.
func waitGone(t *testing.T, v *testenv.Velero, name string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		err := v.Client().Get(context.Background(), client.ObjectKey{Namespace: v.Namespace, Name: name}, &velerov1.Backup{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("backup %s still exists (%w)", name, err)
		}
		if n := files(t, v, name); n != 0 {
			return fmt.Errorf("backup %s: %d file(s) left in the bucket", name, n)
		}
		return nil
	})
}

func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
