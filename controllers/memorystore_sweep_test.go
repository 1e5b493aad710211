package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A failed sweep is tried again after the recheck interval, but never
// sooner than failedSweepRetry after it started: with a recheck interval of
// a second, a sweep that keeps failing would otherwise run back to back.
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
