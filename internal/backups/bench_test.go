package backups_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/internal/backups"
	"github.com/lethe-dev/lethe/internal/benchreport"
	"github.com/lethe-dev/lethe/internal/testenv"
)

var benchBackups = flag.Int("lethe.backups", 1000, "P6: real Velero Backups, all selected and started before the deletion")

// P6 (targets.md): the backup step with 1,000 real Velero Backups, on a real
// kube-apiserver with a real Velero server. Velero takes one Backup of a
// small namespace; its files are copied in the bucket under 999 other names
// and Velero's bucket sync creates those Backups (taking each would take
// Velero about a second). Each setting (client QPS/burst and writes in
// flight) rotates them for a request with an earlier deadline than the one
// before, so its first pass patches every Backup; the recheck only lists
// them. Last, a request whose window ends within seconds: Velero's garbage
// collection removes every Backup and its files, and the time until the
// last is gone is reported.
func BenchmarkP6BackupStep(b *testing.B) {
	ctx := context.Background()
	cp, err := testenv.StartControlPlane()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	v, err := testenv.StartVelero(cp.Config, testenv.VeleroOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer v.Stop()
	newClient := func(qps float32, burst int) client.Client {
		cfg := rest.CopyConfig(cp.Config)
		cfg.QPS, cfg.Burst = qps, burst
		scheme := runtime.NewScheme()
		if err := corev1.AddToScheme(scheme); err != nil {
			b.Fatal(err)
		}
		if err := velerov1.AddToScheme(scheme); err != nil {
			b.Fatal(err)
		}
		c, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	synced := realBackups(b, v, *benchBackups)
	b.Logf("P6 set-up: %d real Backups (one taken by Velero, %d synced from copies in its bucket) in %.1f s", *benchBackups, *benchBackups-1, synced.Seconds())

	sc := backups.Scope{Namespace: v.Namespace, Selector: labels.SelectorFromSet(labels.Set{"app": "memory"}), ClockSkew: time.Second}
	deletedAt := time.Now()
	window := 720 * time.Hour
	for i, s := range []struct {
		name       string
		qps        float32
		burst      int
		concurrent int
	}{
		{"manager-default-qps100-burst200-conc8", 100, 200, 8},
		{"qps200-burst400-conc16", 200, 400, 16},
	} {
		c := newClient(s.qps, s.burst)
		r := backups.Rotator{Client: c, Reader: c, Concurrency: s.concurrent}
		window /= 2 // an earlier deadline than the setting before: every Backup changes
		req := backups.Request{UID: fmt.Sprintf("bench-%d", i), Namespace: "team", Name: "forget", DeletedAt: deletedAt, Window: window}
		first, second := rotateTwice(b, r, sc, req)
		b.ReportMetric(first.Seconds(), s.name+"-first-pass-s")
		b.ReportMetric(second.Seconds(), s.name+"-recheck-s")
		setting := fmt.Sprintf("%d real Backups, QPS %.0f, burst %d, %d writes in flight", *benchBackups, s.qps, s.burst, s.concurrent)
		benchreport.Record(b, benchreport.Row{ID: "P6", Figure: "backup step, first pass (annotate + shorten each)", Setting: setting,
			Unit: "s", Runs: []float64{first.Seconds()}, Target: 10, HasTarget: true})
		benchreport.Record(b, benchreport.Row{ID: "P6", Figure: "backup step, a recheck (list only)", Setting: setting,
			Unit: "s", Runs: []float64{second.Seconds()}})
	}

	c := newClient(100, 200)
	r := backups.Rotator{Client: c, Reader: c, Concurrency: 8}
	req := backups.Request{UID: "bench-gc", Namespace: "team", Name: "forget", DeletedAt: time.Now(), Window: 5 * time.Second}
	if _, err := r.Rotate(ctx, sc, req); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	gone := waitAllGone(b, v, c, req.Deadline(), 30*time.Minute)
	b.ReportMetric(gone.Seconds(), "gc-all-gone-after-expiration-s")
	benchreport.Record(b, benchreport.Row{ID: "P6", Figure: "Velero's garbage collection: every Backup and file gone, after the shortened expiration",
		Setting: fmt.Sprintf("%d real Backups, gofakes3, GC every 1 s", *benchBackups), Unit: "s", Runs: []float64{gone.Seconds()}})
	b.Logf("P6: the last Backup went %.1f s after the rotation", time.Since(t0).Seconds())
}

// realBackups has Velero take one Backup labelled app=memory and copies its
// files in the bucket until n exist; it returns once Velero's sync created
// every Backup object.
func realBackups(b *testing.B, v *testenv.Velero, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	t0 := time.Now()
	c := v.Client()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "memory"}}); err != nil {
		b.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "stand-in", Namespace: "memory"}, Data: map[string]string{"k": "v"}}); err != nil {
		b.Fatal(err)
	}
	opts := testenv.BackupOptions{Labels: map[string]string{"app": "memory"}, Namespaces: []string{"memory"}, TTL: 90 * 24 * time.Hour}
	if _, err := v.TakeBackup(ctx, "daily-0000", opts); err != nil {
		b.Fatal(err)
	}
	if _, err := v.WaitBackup(ctx, "daily-0000"); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := 1; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := v.CopyBackupInBucket("daily-0000", fmt.Sprintf("daily-%04d", i)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if err := v.Restart(); err != nil { // its first sync runs at once
		b.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		list := &velerov1.BackupList{}
		if err := c.List(ctx, list, client.InNamespace(v.Namespace), client.MatchingLabels{"app": "memory"}); err != nil {
			b.Fatal(err)
		}
		if len(list.Items) == n {
			return time.Since(t0)
		}
		if time.Now().After(deadline) {
			b.Fatalf("Velero synced %d of %d Backups in 10 minutes", len(list.Items), n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// rotateTwice times the first pass of a request and a recheck.
func rotateTwice(b *testing.B, r backups.Rotator, sc backups.Scope, req backups.Request) (first, second time.Duration) {
	b.Helper()
	ctx := context.Background()
	t0 := time.Now()
	got, err := r.Rotate(ctx, sc, req)
	first = time.Since(t0)
	if err != nil || len(got) != *benchBackups {
		b.Fatalf("rotate: %d backups, %v", len(got), err)
	}
	for _, g := range got {
		if !g.Changed {
			b.Fatalf("the first pass left %s unchanged", g.Name)
		}
	}
	t0 = time.Now()
	again, err := r.Rotate(ctx, sc, req)
	second = time.Since(t0)
	if err != nil || len(again) != *benchBackups {
		b.Fatalf("second pass: %d backups, %v", len(again), err)
	}
	for _, g := range again {
		if g.Changed {
			b.Fatalf("the second pass changed %s", g.Name)
		}
	}
	return first, second
}

// waitAllGone waits until Velero removed every Backup and every file in the
// bucket, and returns how long after expiredAt that was.
func waitAllGone(b *testing.B, v *testenv.Velero, c client.Client, expiredAt time.Time, timeout time.Duration) time.Duration {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		list := &velerov1.BackupList{}
		if err := c.List(context.Background(), list, client.InNamespace(v.Namespace)); err != nil {
			b.Fatal(err)
		}
		if len(list.Items) == 0 {
			keys, err := v.Store.Keys(testenv.VeleroBucket, "backups/")
			if err != nil {
				b.Fatal(err)
			}
			if len(keys) == 0 {
				return time.Since(expiredAt)
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d Backups left after %s", len(list.Items), timeout)
		}
		time.Sleep(time.Second)
	}
}
