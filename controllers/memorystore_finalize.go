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

// ensureFinalizer puts the store's finalizer on a store not being deleted.
func (r *MemoryStoreReconciler) ensureFinalizer(ctx context.Context, store *lethev1.MemoryStore) error {
	if !store.DeletionTimestamp.IsZero() || controllerutil.ContainsFinalizer(store, StoreFinalizer) {
		return nil
	}
	controllerutil.AddFinalizer(store, StoreFinalizer)
	return patchFinalizers(ctx, r.Client, store)
}

// release lets a store being deleted go once no unfinished request
// references it, ending first the tombstones of requests already gone. The
// store is audited as usual meanwhile: its requests need a current
// SchemaCompliant to finish.
func (r *MemoryStoreReconciler) release(ctx context.Context, store *lethev1.MemoryStore) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(store, StoreFinalizer) {
		// Its finalizer was taken off by hand: its Secrets go with it.
		if err := r.releaseSecrets(ctx, store); err != nil {
			return requeueOnConflict(err)
		}
		forgetAudits(client.ObjectKeyFromObject(store))
		return ctrl.Result{}, nil
	}
	pending, err := r.unfinishedRequests(ctx, store)
	if err != nil {
		return ctrl.Result{}, err
	}
	if pending > 0 {
		r.Recorder.Eventf(store, nil, corev1.EventTypeNormal, ReasonWaitingForRequests, "Finalize",
			"deleted while %d unfinished ErasureRequest(s) reference it: held until they are done, cancelled or gone", pending)
		return ctrl.Result{RequeueAfter: r.NotReadyRetry}, nil
	}
	// Tombstones of requests deleted before (without a status that said
	// so) end now: nothing would reap them once the store is gone. A
	// restored erasure of a gone request is erased again by the store's
	// audit, not lifted: the store waits for it.
	left, err := r.reapTombstones(ctx, store, true)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("a last reap of the store's tombstones before it goes: %w", err)
	}
	if left > 0 {
		r.Recorder.Eventf(store, nil, corev1.EventTypeNormal, ReasonWaitingForRequests, "Finalize",
			"deleted while %d request(s) that are gone have erasures a restore took back: held until its audit erases them again", left)
		return ctrl.Result{RequeueAfter: r.NotReadyRetry}, nil
	}
	// Nothing needs the store's Secrets any more; they go before the store
	// does, or nothing would release them once it is gone.
	if err := r.releaseSecrets(ctx, store); err != nil {
		return requeueOnConflict(err)
	}
	controllerutil.RemoveFinalizer(store, StoreFinalizer)
	if err := patchFinalizers(ctx, r.Client, store); err != nil && !apierrors.IsNotFound(err) {
		return requeueOnConflict(err)
	}
	forgetAudits(client.ObjectKeyFromObject(store))
	return ctrl.Result{}, nil
}

// unfinishedRequests counts the store's requests that are neither done
// (BackupsRotated), cancelled nor planned (they may hold tombstones), and
// those being deleted whose finalizer has not gone yet: a completed one
// may still have its proof to mirror into the store's database.
func (r *MemoryStoreReconciler) unfinishedRequests(ctx context.Context, store *lethev1.MemoryStore) (int, error) {
	list := &lethev1.ErasureRequestList{}
	// Counted, never changed: no copy.
	if err := r.Client.List(ctx, list, client.InNamespace(store.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return 0, fmt.Errorf("list the store's requests: %w", err)
	}
	n := 0
	for i := range list.Items {
		er := &list.Items[i]
		if er.Spec.StoreRef.Name != store.Name {
			continue
		}
		releasing := !er.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(er, Finalizer)
		if releasing || !erasure.Terminal(er) && er.Status.Phase != lethev1.PhaseBackupsRotated {
			n++
		}
	}
	return n, nil
}
