package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func TestPlanExpiry(t *testing.T) {
	plannedAt := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	planning := func(mutate func(*lethev1.ErasureRequest)) *lethev1.ErasureRequest {
		er := &lethev1.ErasureRequest{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{lethev1.LabelPlan: "true"}},
			Spec:       lethev1.ErasureRequestSpec{DryRun: true},
			Status: lethev1.ErasureRequestStatus{Phase: lethev1.PhasePlanned, Conditions: []metav1.Condition{{
				Type: lethev1.ConditionTombstoned, Status: metav1.ConditionFalse, Reason: lethev1.ReasonDryRun,
				LastTransitionTime: metav1.NewTime(plannedAt)}}},
		}
		if mutate != nil {
			mutate(er)
		}
		return er
	}
	const ttl = 10 * time.Minute
	for name, tc := range map[string]struct {
		er     *lethev1.ErasureRequest
		ok     bool
		wantAt time.Time
	}{
		"planned, no annotation": {er: planning(nil), ok: true, wantAt: plannedAt.Add(ttl)},
		"plugin's expiry is later": {er: planning(func(er *lethev1.ErasureRequest) {
			er.Annotations = map[string]string{lethev1.AnnotationPlanExpiresAt: "2026-11-30T13:00:00Z"}
		}), ok: true, wantAt: plannedAt.Add(time.Hour)},
		"plugin's expiry is earlier: the ttl still holds": {er: planning(func(er *lethev1.ErasureRequest) {
			er.Annotations = map[string]string{lethev1.AnnotationPlanExpiresAt: "2026-11-30T11:00:00Z"}
		}), ok: true, wantAt: plannedAt.Add(ttl)},
		"unparsable expiry: the ttl": {er: planning(func(er *lethev1.ErasureRequest) {
			er.Annotations = map[string]string{lethev1.AnnotationPlanExpiresAt: "soon"}
		}), ok: true, wantAt: plannedAt.Add(ttl)},
		"not labelled as a plan":         {er: planning(func(er *lethev1.ErasureRequest) { er.Labels = nil })},
		"not a dry run":                  {er: planning(func(er *lethev1.ErasureRequest) { er.Spec.DryRun = false })},
		"never looked at by the manager": {er: planning(func(er *lethev1.ErasureRequest) { er.Status.Phase = ""; er.Status.Conditions = nil })},
		"stuck on a missing store: counts from the first look": {er: planning(func(er *lethev1.ErasureRequest) {
			er.Status.Phase = lethev1.PhasePending
			er.Status.Conditions[0].Reason = lethev1.ReasonStoreNotFound
		}), ok: true, wantAt: plannedAt.Add(ttl)},
	} {
		t.Run(name, func(t *testing.T) {
			at, ok := planExpiry(tc.er, ttl)
			if ok != tc.ok || !at.Equal(tc.wantAt) {
				t.Errorf("planExpiry = %v, %v; want %v, %v", at, ok, tc.wantAt, tc.ok)
			}
		})
	}
}
