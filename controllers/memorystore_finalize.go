package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
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
	// StoreSecretsFinalizer holds a MemoryStore being deleted, once its
	// requests no longer need it, until it has released its Secrets
	// (SecretFinalizer).
	StoreSecretsFinalizer = "erasure.lethe.dev/store-secrets"
	// ReasonWaitingForRequests is the store's event while its finalizer holds.
	ReasonWaitingForRequests = "WaitingForRequests"
)

// ensureFinalizer puts the store's finalizers on a store not being deleted.
func (r *MemoryStoreReconciler) ensureFinalizer(ctx context.Context, store *lethev1.MemoryStore) error {
	if !store.DeletionTimestamp.IsZero() {
		return nil
	}
	added := controllerutil.AddFinalizer(store, StoreFinalizer)
	if controllerutil.AddFinalizer(store, StoreSecretsFinalizer) || added {
		return patchFinalizers(ctx, r.Client, store)
	}
	return nil
}

// release lets a store being deleted go in two steps, each ended by taking
// off one of its finalizers, so that a failure between them is never
// retried from the start. First, once no unfinished request references
// it, it ends the tombstones of requests already gone (this needs its
// database, so its Secrets); the store is audited as usual meanwhile: its
// requests need a current SchemaCompliant to finish. Then it releases its
// Secrets, which may go at once (a namespace being deleted), and nothing
// after that needs them.
func (r *MemoryStoreReconciler) release(ctx context.Context, store *lethev1.MemoryStore) (ctrl.Result, error) {
	if controllerutil.ContainsFinalizer(store, StoreFinalizer) {
		if res, done, err := r.releaseRequests(ctx, store); !done || err != nil {
			return res, err
		}
	}
	// Also when only another controller's finalizer keeps the store (ours
	// taken off by hand): nothing else would release its Secrets.
	if err := r.releaseSecrets(ctx, store); err != nil {
		return requeueOnConflict(err)
	}
	if controllerutil.RemoveFinalizer(store, StoreSecretsFinalizer) {
		if err := patchFinalizers(ctx, r.Client, store); err != nil && !apierrors.IsNotFound(err) {
			return requeueOnConflict(err)
		}
	}
	forgetAudits(client.ObjectKeyFromObject(store))
	return ctrl.Result{}, nil
}

// releaseRequests is release's first step: done once StoreFinalizer is
// off. A store that predates StoreSecretsFinalizer releases its Secrets
// here, before the finalizer that holds it goes.
func (r *MemoryStoreReconciler) releaseRequests(ctx context.Context, store *lethev1.MemoryStore) (ctrl.Result, bool, error) {
	pending, err := r.unfinishedRequests(ctx, store)
	if err != nil {
		return ctrl.Result{}, false, err
	}
	if pending > 0 {
		r.Recorder.Eventf(store, nil, corev1.EventTypeNormal, ReasonWaitingForRequests, "Finalize",
			"deleted while %d unfinished ErasureRequest(s) reference it: held until they are done, cancelled or gone", pending)
		return ctrl.Result{RequeueAfter: r.NotReadyRetry}, false, nil
	}
	// Tombstones of requests deleted before (without a status that said
	// so) end now: nothing would reap them once the store is gone. A
	// restored erasure of a gone request is erased again by the store's
	// audit, not lifted: the store waits for it.
	left, err := r.reapTombstones(ctx, store, true)
	if err != nil {
		return ctrl.Result{}, false, fmt.Errorf("a last reap of the store's tombstones before it goes: %w", err)
	}
	if left > 0 {
		r.Recorder.Eventf(store, nil, corev1.EventTypeNormal, ReasonWaitingForRequests, "Finalize",
			"deleted while %d request(s) that are gone have erasures a restore took back: held until its audit erases them again", left)
		return ctrl.Result{RequeueAfter: r.NotReadyRetry}, false, nil
	}
	if !controllerutil.ContainsFinalizer(store, StoreSecretsFinalizer) {
		if err := r.releaseSecrets(ctx, store); err != nil {
			res, err := requeueOnConflict(err)
			return res, false, err
		}
		// Its Secrets may be gone now: a conflict is retried here, not
		// from the reap, which needs them.
		uid := store.UID
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := r.reader().Get(ctx, client.ObjectKeyFromObject(store), store); err != nil {
				return err
			}
			if store.UID != uid {
				// Gone, and another store made under its name.
				return apierrors.NewNotFound(lethev1.GroupVersion.WithResource("memorystores").GroupResource(), store.Name)
			}
			controllerutil.RemoveFinalizer(store, StoreFinalizer)
			return patchFinalizers(ctx, r.Client, store)
		})
		return ctrl.Result{}, err == nil || apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	controllerutil.RemoveFinalizer(store, StoreFinalizer)
	if err := patchFinalizers(ctx, r.Client, store); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, true, nil
		}
		res, err := requeueOnConflict(err)
		return res, false, err
	}
	return ctrl.Result{}, true, nil
}

// unfinishedRequests counts the store's requests that are neither done
// (BackupsRotated), cancelled nor planned: they may hold tombstones. A
// completed request being deleted is not waited for: its proof is mirrored
// if it can be while the store exists, but a mirror that can never succeed
// (a receipt log found inconsistent) would hold the store, and its
// namespace, for good.
func (r *MemoryStoreReconciler) unfinishedRequests(ctx context.Context, store *lethev1.MemoryStore) (int, error) {
	list := &lethev1.ErasureRequestList{}
	// Counted, never changed: no copy.
	if err := r.Client.List(ctx, list, client.InNamespace(store.Namespace), client.UnsafeDisableDeepCopy); err != nil {
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
