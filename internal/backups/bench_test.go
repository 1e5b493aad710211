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
	"github.com/lethe-dev/lethe/internal/testenv"
)

var benchBackups = flag.Int("lethe.backups", 1000, "P6: Velero Backups in the cluster, all selected and started before the deletion")

// P6 (targets.md): the backup step with 1,000 Backups in the cluster, on a
// real kube-apiserver with Velero's CRDs. Each setting is a client QPS/burst
// and a write concurrency; the step's first pass patches every Backup, the
// next pass (what every recheck costs) only lists them.
func BenchmarkP6BackupStep(b *testing.B) {
	cp, err := testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{Velero: true})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	if err := velerov1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	newClient := func(qps float32, burst int) client.Client {
		cfg := rest.CopyConfig(cp.Config)
		cfg.QPS, cfg.Burst = qps, burst
		c, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	setup := newClient(1000, 2000)
	ctx := context.Background()
	for _, s := range []struct {
		name       string
		qps        float32
		burst      int
		concurrent int
	}{
		{"manager-default-qps100-burst200-conc8", 100, 200, 8},
		{"qps200-burst400-conc16", 200, 400, 16},
	} {
		ns := fmt.Sprintf("velero-%d", time.Now().UnixNano())
		if err := setup.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
		deletedAt := time.Now()
		createBackups(b, setup, ns, *benchBackups, deletedAt)
		c := newClient(s.qps, s.burst)
		r := backups.Rotator{Client: c, Reader: c, Concurrency: s.concurrent}
		sc := backups.Scope{Namespace: ns, Selector: labels.SelectorFromSet(labels.Set{"app": "memory"})}
		req := backups.Request{UID: "bench", Namespace: "team", Name: "forget", DeletedAt: deletedAt, Window: 720 * time.Hour}
		t0 := time.Now()
		got, err := r.Rotate(ctx, sc, req)
		first := time.Since(t0)
		if err != nil || len(got) != *benchBackups {
			b.Fatalf("rotate: %d backups, %v", len(got), err)
		}
		t0 = time.Now()
		again, err := r.Rotate(ctx, sc, req)
		second := time.Since(t0)
		if err != nil || len(again) != *benchBackups {
			b.Fatalf("second pass: %d backups, %v", len(again), err)
		}
		for _, g := range again {
			if g.Changed {
				b.Fatalf("the second pass changed %s", g.Name)
			}
		}
		b.ReportMetric(first.Seconds(), s.name+"-first-pass-s")
		b.ReportMetric(second.Seconds(), s.name+"-recheck-s")
		b.Logf("P6 (%d Backups, QPS %.0f, burst %d, %d writes in flight): first pass (annotate + shorten each) %.2f s (target ≤ 10 s); a recheck (list only, nothing to change) %.2f s",
			*benchBackups, s.qps, s.burst, s.concurrent, first.Seconds(), second.Seconds())
	}
}

func createBackups(b *testing.B, c client.Client, ns string, n int, deletedAt time.Time) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			bk := &velerov1.Backup{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("daily-%04d", i), Namespace: ns, Labels: map[string]string{"app": "memory"}},
				Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted,
					StartTimestamp: &metav1.Time{Time: deletedAt.Add(-time.Duration(i+1) * time.Minute)},
					Expiration:     &metav1.Time{Time: deletedAt.Add(90 * 24 * time.Hour)}},
			}
			if err := c.Create(ctx, bk); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
