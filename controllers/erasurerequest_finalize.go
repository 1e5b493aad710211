package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// finalize handles the deletion of the request object. During the grace
// period it lifts the tombstones (the database keeps a Cancelled receipt);
// once deletion started it finishes it; afterwards it undoes nothing.
func (r *ErasureRequestReconciler) finalize(ctx context.Context, er *lethev1.ErasureRequest) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(er, Finalizer) {
		return ctrl.Result{}, nil
	}
	tombstoned := meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionTombstoned)
	deleted := meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionDeleted)
	switch {
	case tombstoned && !deleted:
		if err := r.withdraw(ctx, er); err != nil {
			return ctrl.Result{}, err
		}
	case !deleted:
		r.withdrawIfHeld(ctx, er)
	}
	if deleted {
		// The store's record keeps what was erased once the object is gone,
		// so that a later restore of the database is still found.
		if err := r.recordErasure(ctx, er); err != nil {
			return ctrl.Result{}, err
		}
		// So does the proof: a request deleted before a pass mirrored it
		// has it mirrored now (its status is what the API server holds).
		if err := r.mirrorBeforeRelease(ctx, er); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.machine.Forget(string(er.UID))
	r.finishing.Delete(er.UID)
	r.mirrored.Delete(er.UID)
	r.Withheld.forget(er.UID)
	r.guarded.Delete(er.UID)
	controllerutil.RemoveFinalizer(er, Finalizer)
	if err := patchFinalizers(ctx, r.Client, er); err != nil && !apierrors.IsNotFound(err) {
		return requeueOnConflict(err)
	}
	return ctrl.Result{}, nil
}

// ReasonFinishingBeforeRelease is the request's event when it is deleted
// after its deletion was claimed: the finalizer holds until it completes.
const ReasonFinishingBeforeRelease = "FinishingBeforeRelease"

// finishesFirst reports whether a request being deleted must first finish
// its steps: once its deletion is claimed, the graph prune and the backup
// rotation still have to happen (a GitOps prune or a namespace clean-up
// must not leave the erased data in the graph and the backups). A request
// whose MemoryStore is gone cannot finish and is released.
func (r *ErasureRequestReconciler) finishesFirst(ctx context.Context, er *lethev1.ErasureRequest) bool {
	if !controllerutil.ContainsFinalizer(er, Finalizer) || erasure.Terminal(er) || er.Status.Phase == lethev1.PhaseBackupsRotated ||
		!erasure.DeletionClaimed(er) {
		return false
	}
	store := &lethev1.MemoryStore{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: er.Namespace, Name: er.Spec.StoreRef.Name}, store); apierrors.IsNotFound(err) {
		return false
	}
	if _, said := r.finishing.LoadOrStore(er.UID, true); !said {
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, ReasonFinishingBeforeRelease, "Finalize",
			"deleted after its deletion was claimed: the finalizer holds until the graph and the backups are done too")
	}
	return true
}

// withdrawIfHeld withdraws a request whose status does not say Tombstoned
// but whose ledger rows do (a manager that died right after the tombstone's
// commit). Best effort: when the database cannot be asked, the request is
// released and the store's reaper ends its tombstones later.
func (r *ErasureRequestReconciler) withdrawIfHeld(ctx context.Context, er *lethev1.ErasureRequest) {
	log := ctrl.LoggerFrom(ctx)
	store := &lethev1.MemoryStore{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: er.Namespace, Name: er.Spec.StoreRef.Name}, store); err != nil {
		return
	}
	ports, err := r.Connector.Ports(ctx, store)
	if err == nil {
		var held int64
		if held, err = ports.Ledger.HeldBy(ctx, string(er.UID)); err == nil && held > 0 {
			err = r.withdraw(ctx, er)
		}
	}
	if err != nil {
		log.Info("released without asking the ledger; the store's reaper ends any tombstone left", "error", err.Error())
	}
}

// withdraw lifts the tombstones of a request deleted during its grace
// period, or finishes a deletion that had started rather than leave it
// half-done.
func (r *ErasureRequestReconciler) withdraw(ctx context.Context, er *lethev1.ErasureRequest) error {
	store := &lethev1.MemoryStore{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: er.Namespace, Name: er.Spec.StoreRef.Name}, store); err != nil {
		if apierrors.IsNotFound(err) {
			r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, lethev1.ReasonStoreNotFound, "Finalize",
				"MemoryStore gone: the tombstones of this request stay in the database")
			return nil
		}
		return err
	}
	ports, err := r.Connector.Ports(ctx, store)
	if err != nil {
		return err
	}
	c, err := ports.Ledger.Cancel(ctx, string(er.UID))
	switch {
	case errors.Is(err, erasure.ErrTooLateToCancel):
		if _, err := ports.Ledger.Delete(ctx, erasure.LedgerRequest(er), r.BatchSize, 0); err != nil {
			return err
		}
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "DeletionFinished", "Finalize", "request deleted mid-deletion: the deletion was finished")
	case err != nil:
		return err
	default:
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "Withdrawn", "Finalize", "request deleted during the grace period: %d tombstone(s) lifted", c.Lifted)
	}
	return nil
}

// recordErasure adds er to its store's record (without the sources when
// the MemoryStore is gone).
func (r *ErasureRequestReconciler) recordErasure(ctx context.Context, er *lethev1.ErasureRequest) error {
	if r.Records == nil {
		return nil
	}
	store := &lethev1.MemoryStore{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: er.Namespace, Name: er.Spec.StoreRef.Name}, store); err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		store = nil
	}
	return r.Records.Add(ctx, store, er)
}

// mirrorBeforeRelease mirrors a completed request's proof into its store's
// database before the object goes, unless the database holds it already
// (mirroredBefore asks it even when this process mirrored it: a restore
// may have taken it back, and the object is the last copy) or the store is
// gone (nothing to write it to). When the database cannot be reached, a
// proof this process mirrored counts as held. A store being deleted does
// not wait for it (unfinishedRequests).
func (r *ErasureRequestReconciler) mirrorBeforeRelease(ctx context.Context, er *lethev1.ErasureRequest) error {
	if er.Status.Receipt == nil {
		return nil
	}
	store := &lethev1.MemoryStore{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: er.Namespace, Name: er.Spec.StoreRef.Name}, store); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	ports, err := r.Connector.Ports(ctx, store)
	if err != nil {
		if n, ok := r.mirrored.Load(er.UID); ok && n.(int) == len(er.Status.History) {
			return nil
		}
		return fmt.Errorf("mirror the proof before the request goes: %w", err)
	}
	err = r.mirrorUnlessHeld(ctx, &erasure.Scope{Request: er, Store: store, Ports: ports}, er)
	if errors.Is(err, evidence.ErrReceiptChanged) {
		r.mirrorFailed(ctx, er, err) // the object is the copy that was not edited: it stays
	}
	return err
}
