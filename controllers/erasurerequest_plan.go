package controllers

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// DefaultPlanTTL is how long a planning request stays after its plan when
// the plugin that made it did not delete it.
const DefaultPlanTTL = 10 * time.Minute

// planExpiry says when a planning request left behind may be deleted: once
// both the plugin's own expiry and ttl after the manager first looked at it
// have passed — planned or not (a plan against a mistyped store never plans).
// Only a dry run labelled as a plan qualifies (ok false otherwise): a request
// that may erase anything is never deleted by the manager. The first look is
// the Tombstoned condition's transition time, which the manager sets from its
// own clock on its first pass and keeps while the status stays False, so a
// skewed clock cannot make it delete a plan the moment it is written.
func planExpiry(er *lethev1.ErasureRequest, ttl time.Duration) (at time.Time, ok bool) {
	if !er.Spec.DryRun || er.Labels[lethev1.LabelPlan] != "true" {
		return time.Time{}, false
	}
	first := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionTombstoned)
	if first == nil || first.Status != metav1.ConditionFalse {
		return time.Time{}, false
	}
	at = first.LastTransitionTime.Add(ttl)
	if t, err := time.Parse(time.RFC3339, er.Annotations[lethev1.AnnotationPlanExpiresAt]); err == nil && t.After(at) {
		at = t
	}
	return at, true
}

// reapPlan deletes a planning request its plugin left behind once it has
// expired (done true). Otherwise a planned one comes back then; one still
// working goes on with its steps and is looked at again on its next pass.
func (r *ErasureRequestReconciler) reapPlan(ctx context.Context, er *lethev1.ErasureRequest) (res ctrl.Result, done bool, err error) {
	ttl := r.PlanTTL
	if ttl <= 0 {
		ttl = DefaultPlanTTL
	}
	at, ok := planExpiry(er, ttl)
	if !ok {
		return ctrl.Result{}, false, nil
	}
	if wait := at.Sub(r.Clock.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, false, nil
	}
	// Preconditioned on the version read, so a request changed since is
	// looked at again rather than deleted.
	uid, rv := er.UID, er.ResourceVersion
	if err := r.Client.Delete(ctx, er, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil {
		return ctrl.Result{}, true, client.IgnoreNotFound(err)
	}
	ctrl.LoggerFrom(ctx).Info("deleted a planning request its plugin left behind")
	return ctrl.Result{}, true, nil
}
