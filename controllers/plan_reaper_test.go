package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

// A planning request whose plugin was killed before deleting it is deleted
// by the manager once it has expired; a dry run not made by the plugin, and
// a request that erases, are never deleted by the manager.
func TestManagerDeletesPlanningRequestsLeftBehind(t *testing.T) {
	e := newMemoryEnv(t, "plan-reaper")
	expired := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	left := e.request(t, "left-behind-plan-x1y2z", func(er *lethev1.ErasureRequest) {
		er.Labels = map[string]string{lethev1.LabelPlan: "true"}
		er.Annotations = map[string]string{lethev1.AnnotationPlanExpiresAt: expired}
		er.Spec.DryRun, er.Spec.Immediate, er.Spec.Reason = true, false, ""
	})
	ownDryRun := e.request(t, "own-dry-run", func(er *lethev1.ErasureRequest) {
		er.Spec.DryRun, er.Spec.Immediate, er.Spec.Reason = true, false, ""
	})
	// A plan against a mistyped store never plans; it is deleted all the same.
	noStore := e.request(t, "no-store-plan-a1b2c", func(er *lethev1.ErasureRequest) {
		er.Labels = map[string]string{lethev1.LabelPlan: "true"}
		er.Annotations = map[string]string{lethev1.AnnotationPlanExpiresAt: expired}
		er.Spec.DryRun, er.Spec.Immediate, er.Spec.Reason = true, false, ""
		er.Spec.StoreRef.Name = "no-such-store"
	})
	labelledErasure := e.request(t, "labelled-erasure", func(er *lethev1.ErasureRequest) {
		er.Labels = map[string]string{lethev1.LabelPlan: "true"}
		er.Annotations = map[string]string{lethev1.AnnotationPlanExpiresAt: expired}
		er.Spec.SessionIDs = []lethev1.SessionID{keptB}
	})
	waitPhase(t, left, lethev1.PhasePlanned)
	waitPhase(t, ownDryRun, lethev1.PhasePlanned)
	waitPhase(t, labelledErasure, lethev1.PhaseBackupsRotated)
	waitStepReason(t, noStore, lethev1.ConditionTombstoned, lethev1.ReasonStoreNotFound)

	// Within the manager's TTL after the plan, the planning request stays.
	nudge(t, left, noStore, ownDryRun, labelledErasure)
	time.Sleep(2 * time.Second)
	for _, er := range []*lethev1.ErasureRequest{left, noStore} {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), &lethev1.ErasureRequest{}); err != nil {
			t.Fatalf("%s was deleted before its TTL: %v", er.Name, err)
		}
	}

	// The suite's operator clock is frozen; step it past the TTL.
	operatorClock.Step(controllers.DefaultPlanTTL + time.Minute)
	nudge(t, left, noStore, ownDryRun, labelledErasure)
	for _, er := range []*lethev1.ErasureRequest{left, noStore} {
		eventually(t, 30*time.Second, func() error {
			err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), &lethev1.ErasureRequest{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("planning request %s still there (%w)", er.Name, err)
		})
	}
	// A pass over the others has run since (they were nudged with it).
	for _, er := range []*lethev1.ErasureRequest{ownDryRun, labelledErasure} {
		got := &lethev1.ErasureRequest{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), got); err != nil {
			t.Errorf("%s: %v", er.Name, err)
		} else if !got.DeletionTimestamp.IsZero() {
			t.Errorf("%s is being deleted by the manager", er.Name)
		}
	}
}

// nudge changes an annotation of each request, so that the manager
// reconciles them now rather than when their requeue comes.
func nudge(t *testing.T, ers ...*lethev1.ErasureRequest) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{"test.lethe.dev/nudge": time.Now().Format(time.RFC3339Nano)}}})
	for _, er := range ers {
		if err := k8s.Patch(context.Background(), er, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
	}
}
