package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

const lastAuditMetric = "lethe_memorystore_last_audit_timestamp_seconds"

// Every audit that checks a store's erasures against its database sets
// lethe_memorystore_last_audit_timestamp_seconds, whose age the alert
// LetheStoreAuditOverdue watches: it is there once the store is audited, it
// moves with each recheck, and it goes with the store.
func TestEveryStoreAuditSetsItsTimestamp(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "audit-gauge")
	var first float64
	eventually(t, 30*time.Second, func() error {
		if first = gaugeValue(t, lastAuditMetric, "namespace", e.ns); first <= 0 {
			return fmt.Errorf("%s = %v, want the time of the store's audit", lastAuditMetric, first)
		}
		return nil
	})
	if now := float64(time.Now().Unix()); first > now || first < now-60 {
		t.Fatalf("%s = %v, %v seconds from now: not the audit's time", lastAuditMetric, first, now-first)
	}
	eventually(t, 5*storeRecheckForTests+10*time.Second, func() error {
		if v := gaugeValue(t, lastAuditMetric, "namespace", e.ns); v <= first {
			return fmt.Errorf("%s = %v, not past %v after the recheck interval", lastAuditMetric, v, first)
		}
		return nil
	})
	if err := k8s.Delete(ctx, e.store); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(e.store), &lethev1.MemoryStore{}); err == nil {
			return fmt.Errorf("the store still exists")
		}
		if v := gaugeValue(t, lastAuditMetric, "namespace", e.ns); v != -1 {
			return fmt.Errorf("%s = %v after the store went, want no series", lastAuditMetric, v)
		}
		return nil
	})
}
