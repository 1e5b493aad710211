package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=memorystores,verbs=patch
// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=memorystores/finalizers,verbs=update

const (
	// StoreFinalizer holds a MemoryStore that is deleted while requests that
	// may hold tombstones in its database, or be mid-deletion, reference it:
	// they need it to lift or finish (a store deleted first left their
	// tombstones in force for ever).
	StoreFinalizer = "erasure.lethe.dev/store-requests"
	// ReasonWaitingForRequests is the store's event while its finalizer holds.
	ReasonWaitingForRequests = "WaitingForRequests"
)

// holdStore puts the store's finalizer on; on a store being deleted it
// releases the finalizer once no unfinished request references it, ending
// the tombstones of requests already gone first. done is true when the
// store is being deleted (the pass ends with res).
func (r *MemoryStoreReconciler) holdStore(ctx context.Context, store *lethev1.MemoryStore) (res ctrl.Result, done bool, err error) {
	if store.DeletionTimestamp.IsZero() {
		if controllerutil.ContainsFinalizer(store, StoreFinalizer) {
			return ctrl.Result{}, false, nil
		}
		controllerutil.AddFinalizer(store, StoreFinalizer)
		if err := patchFinalizers(ctx, r.Client, store); err != nil {
			res, err := requeueOnConflict(err)
			return res, true, err
		}
		return ctrl.Result{}, false, nil
	}
	if !controllerutil.ContainsFinalizer(store, StoreFinalizer) {
		return ctrl.Result{}, true, nil
	}
	pending, err := r.unfinishedRequests(ctx, store)
	if err != nil {
		return ctrl.Result{}, true, err
	}
	if pending > 0 {
		r.Recorder.Eventf(store, nil, corev1.EventTypeNormal, ReasonWaitingForRequests, "Finalize",
			"deleted while %d unfinished ErasureRequest(s) reference it: held until they are done, cancelled or gone", pending)
		return ctrl.Result{RequeueAfter: r.NotReadyRetry}, true, nil
	}
	// Tombstones of requests deleted before (without a status that said
	// so) end now: nothing would reap them once the store is gone.
	if err := r.reapTombstones(ctx, store, true); err != nil {
		ctrl.LoggerFrom(ctx).Info("the store is released without a last reap of its tombstones", "error", err.Error())
	}
	controllerutil.RemoveFinalizer(store, StoreFinalizer)
	if err := patchFinalizers(ctx, r.Client, store); err != nil && !apierrors.IsNotFound(err) {
		res, err := requeueOnConflict(err)
		return res, true, err
	}
	return ctrl.Result{}, true, nil
}

// unfinishedRequests counts the store's requests that are neither done
// (BackupsRotated), cancelled nor planned: they may hold tombstones.
func (r *MemoryStoreReconciler) unfinishedRequests(ctx context.Context, store *lethev1.MemoryStore) (int, error) {
	list := &lethev1.ErasureRequestList{}
	if err := r.Client.List(ctx, list, client.InNamespace(store.Namespace)); err != nil {
		return 0, fmt.Errorf("list the store's requests: %w", err)
	}
	n := 0
	for i := range list.Items {
		er := &list.Items[i]
		if er.Spec.StoreRef.Name == store.Name && !erasure.Terminal(er) && er.Status.Phase != lethev1.PhaseBackupsRotated {
			n++
		}
	}
	return n, nil
}
