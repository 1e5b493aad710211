package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A failed sweep is tried again after the recheck interval, but never
// sooner than failedSweepRetry after it started: with a short recheck
// interval, a sweep that keeps failing would otherwise run back to back.
func TestAFailedSweepWaitsAtLeastAMinute(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	store := func(result string, ago time.Duration) *lethev1.MemoryStore {
		return &lethev1.MemoryStore{Status: lethev1.MemoryStoreStatus{GraphSweep: &lethev1.GraphSweepStatus{
			StartedAt: metav1.NewTime(now.Add(-ago)), Result: result}}}
	}
	for name, tc := range map[string]struct {
		recheck time.Duration
		store   *lethev1.MemoryStore
		want    time.Duration
	}{
		"failed, short recheck":    {time.Second, store(lethev1.SweepFailed, 10*time.Second), failedSweepRetry - 10*time.Second},
		"failed, long recheck":     {5 * time.Minute, store(lethev1.SweepFailed, 10*time.Second), 5*time.Minute - 10*time.Second},
		"failed long ago":          {time.Second, store(lethev1.SweepFailed, 2*time.Minute), -time.Minute},
		"completed, short recheck": {time.Second, store(lethev1.SweepCompleted, time.Hour), sweepInterval(&lethev1.MemoryStore{}) - time.Hour},
		"never swept":              {time.Second, &lethev1.MemoryStore{}, 0},
	} {
		r := &MemoryStoreReconciler{RecheckInterval: tc.recheck, Clock: clocktesting.NewFakeClock(now)}
		if got := r.sweepWait(tc.store); got != tc.want {
			t.Errorf("%s: next sweep in %s, want %s", name, got, tc.want)
		}
	}
}

// After a sweep that ran longer than its own wait (a failed one that took
// its whole timeout; a completed one longer than the sweep interval), the
// next pass is still a positive wait away: RequeueAfter must never be zero
// or less, or the store is not audited again.
func TestAfterALongSweepTheStoreIsStillRequeued(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	r := &MemoryStoreReconciler{RecheckInterval: 5 * time.Minute, Clock: clocktesting.NewFakeClock(now)}
	for name, tc := range map[string]struct {
		result string
		took   time.Duration
		want   time.Duration
	}{
		"failed after its 30m timeout": {lethev1.SweepFailed, 30 * time.Minute, failedSweepRetry},
		"failed quickly":               {lethev1.SweepFailed, time.Second, 5*time.Minute - time.Second},
		"completed after 8 days":       {lethev1.SweepCompleted, 8 * 24 * time.Hour, failedSweepRetry},
	} {
		store := &lethev1.MemoryStore{Status: lethev1.MemoryStoreStatus{GraphSweep: &lethev1.GraphSweepStatus{
			StartedAt: metav1.NewTime(now.Add(-tc.took)), Result: tc.result}}}
		if got := r.waitAfterSweep(store); got != tc.want {
			t.Errorf("%s: next pass in %s, want %s", name, got, tc.want)
		}
	}
}
