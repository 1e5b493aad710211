package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;patch

// SecretFinalizerPrefix begins the finalizer each MemoryStore puts on the
// Secrets it reads (its database's and replicas' DSNs, its graph's URL),
// followed by the store's UID: SecretFinalizer. A namespace deleted at once
// deletes its Secrets with everything else, and without them the requests'
// and the store's finalizers could neither lift tombstones, finish a
// claimed deletion nor mirror a proof: the namespace stayed Terminating
// for good. Like a PersistentVolumeClaim in use, a Secret a store reads is
// deleted only once the store lets it go. One finalizer per store, so that
// stores sharing a Secret release it each for itself. Lethe changes
// nothing else of a Secret: the ValidatingAdmissionPolicy shipped with it
// refuses any other change by its service account.
const SecretFinalizerPrefix = "erasure.lethe.dev/store-secret."

// SecretFinalizer is store's finalizer on the Secrets it reads.
func SecretFinalizer(store *lethev1.MemoryStore) string {
	return SecretFinalizerPrefix + string(store.UID)
}

// ReasonSecretNotHeld is the store's Warning event when it could not put its
// finalizer on a Secret it reads: a namespace deletion could then take the
// Secret before the store's requests are done.
const ReasonSecretNotHeld = "SecretNotHeld"

// readSecrets lists the names of the Secrets store reads, sorted, once
// each.
func readSecrets(store *lethev1.MemoryStore) []string {
	names := []string{store.Spec.Postgres.DSNSecretRef.Name}
	for _, r := range store.Spec.Postgres.Replicas {
		names = append(names, r.DSNSecretRef.Name)
	}
	if store.Spec.FalkorDB != nil {
		names = append(names, store.Spec.FalkorDB.URLSecretRef.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// holdSecrets, for a store not being deleted, puts its finalizer on each
// Secret it reads (checked at every audit: a finalizer removed by hand, or
// a Secret created again, is held again) and takes it off each Secret
// status.heldSecrets lists that it no longer reads. The status is written
// ahead: a Secret is listed before its finalizer is put on, and unlisted
// only once it is taken off, so that no failure leaves a finalizer the
// store would not release. A Secret missing or being deleted is not an
// error (the store's conditions say what is wrong with it).
func (r *MemoryStoreReconciler) holdSecrets(ctx context.Context, store *lethev1.MemoryStore) error {
	wanted := readSecrets(store)
	if ahead := union(store.Status.HeldSecrets, wanted); !slices.Equal(ahead, store.Status.HeldSecrets) {
		if err := r.setHeldSecrets(ctx, store, ahead); err != nil {
			return err
		}
	}
	var errs []error
	for _, name := range wanted {
		if err := r.holdSecret(ctx, store, name); err != nil {
			errs = append(errs, err)
		}
	}
	kept := wanted
	for _, name := range store.Status.HeldSecrets {
		if slices.Contains(wanted, name) {
			continue
		}
		if err := r.releaseSecret(ctx, store, name); err != nil {
			errs = append(errs, err)
			kept = union(kept, []string{name})
		}
	}
	if !slices.Equal(kept, store.Status.HeldSecrets) {
		errs = append(errs, r.setHeldSecrets(ctx, store, kept))
	}
	return errors.Join(errs...)
}

// holdSecretsOf runs holdSecrets for a store not being deleted, or still
// waiting for its requests (a Secret created again meanwhile is held too),
// saying what failed (a Warning event, unless only conflicts: the caller
// retries soon); the audit goes on either way.
func (r *MemoryStoreReconciler) holdSecretsOf(ctx context.Context, store *lethev1.MemoryStore) error {
	if !store.DeletionTimestamp.IsZero() {
		// A cached store may not show that a pass already released it:
		// never hold for a store past its first step.
		fresh := &lethev1.MemoryStore{}
		if err := r.reader().Get(ctx, client.ObjectKeyFromObject(store), fresh); err != nil || fresh.UID != store.UID ||
			!controllerutil.ContainsFinalizer(fresh, StoreFinalizer) {
			return client.IgnoreNotFound(err)
		}
	}
	err := r.holdSecrets(ctx, store)
	if err != nil && !onlyConflicts(err) {
		ctrl.LoggerFrom(ctx).Info("could not hold or release the store's Secrets", "error", err.Error())
		r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, ReasonSecretNotHeld, "HoldSecrets",
			"could not put or take off its finalizer on a Secret it reads: %v", err)
	}
	return err
}

// onlyConflicts reports whether err, one error or joined ones, holds
// conflicts only.
func onlyConflicts(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !onlyConflicts(e) {
				return false
			}
		}
		return len(joined.Unwrap()) > 0
	}
	return apierrors.IsConflict(err)
}

// setHeldSecrets writes status.heldSecrets alone, against the store as read
// (a list written from a stale spec could unlist a Secret still held).
func (r *MemoryStoreReconciler) setHeldSecrets(ctx context.Context, store *lethev1.MemoryStore, names []string) error {
	before := store.DeepCopy()
	store.Status.HeldSecrets = names
	if err := r.Client.Status().Patch(ctx, store, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		store.Status.HeldSecrets = before.Status.HeldSecrets
		return fmt.Errorf("write the Secrets the store holds: %w", err)
	}
	return nil
}

// holdSecret puts store's finalizer on its Secret name, unless it is
// missing or being deleted (the API server takes no new finalizer then).
func (r *MemoryStoreReconciler) holdSecret(ctx context.Context, store *lethev1.MemoryStore, name string) error {
	secret, err := r.readSecret(ctx, store, name)
	if secret == nil {
		return err
	}
	key := client.ObjectKeyFromObject(secret)
	// A failed orphan check leaves the orphans for the next audit, not the
	// store's own hold.
	orphans, orphanErr := r.orphanFinalizers(ctx, store, secret)
	changed := false
	for _, f := range orphans {
		changed = controllerutil.RemoveFinalizer(secret, f) || changed
	}
	if secret.DeletionTimestamp.IsZero() {
		changed = controllerutil.AddFinalizer(secret, SecretFinalizer(store)) || changed
	}
	if !changed {
		return orphanErr
	}
	if err := patchFinalizers(ctx, r.Client, secret); err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(orphanErr, fmt.Errorf("hold Secret %s: %w", key, err))
	}
	return orphanErr
}

// orphanFinalizers lists the store-secret finalizers on secret whose store
// is gone without releasing it (its finalizers removed by hand, a store
// object copied with its metadata): nothing else would ever take them off,
// and the Secret, and its namespace, could never be deleted. Stores are
// read from the API server, never the cache (none without an APIReader):
// a store just created must not look gone.
func (r *MemoryStoreReconciler) orphanFinalizers(ctx context.Context, store *lethev1.MemoryStore, secret *corev1.Secret) ([]string, error) {
	var others []string
	for _, f := range secret.Finalizers {
		if strings.HasPrefix(f, SecretFinalizerPrefix) && f != SecretFinalizer(store) {
			others = append(others, f)
		}
	}
	if len(others) == 0 || r.APIReader == nil {
		return nil, nil
	}
	stores := &lethev1.MemoryStoreList{}
	if err := r.APIReader.List(ctx, stores, client.InNamespace(store.Namespace)); err != nil {
		return nil, fmt.Errorf("list the stores that may hold Secret %s: %w", secret.Name, err)
	}
	return slices.DeleteFunc(others, func(f string) bool {
		return slices.ContainsFunc(stores.Items, func(s lethev1.MemoryStore) bool { return SecretFinalizer(&s) == f })
	}), nil
}

// releaseSecrets takes store's finalizer off every Secret it held or reads.
func (r *MemoryStoreReconciler) releaseSecrets(ctx context.Context, store *lethev1.MemoryStore) error {
	var errs []error
	for _, name := range union(readSecrets(store), store.Status.HeldSecrets) {
		errs = append(errs, r.releaseSecret(ctx, store, name))
	}
	return errors.Join(errs...)
}

// releaseSecret takes store's finalizer off its Secret name.
func (r *MemoryStoreReconciler) releaseSecret(ctx context.Context, store *lethev1.MemoryStore, name string) error {
	secret, err := r.readSecret(ctx, store, name)
	if secret == nil || !controllerutil.RemoveFinalizer(secret, SecretFinalizer(store)) {
		return err
	}
	if err := patchFinalizers(ctx, r.Client, secret); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("release Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	return nil
}

// readSecret reads the Secret name of the store's namespace from the API
// server (Lethe caches no Secret); nil when it does not exist.
func (r *MemoryStoreReconciler) readSecret(ctx context.Context, store *lethev1.MemoryStore, name string) (*corev1.Secret, error) {
	key := types.NamespacedName{Namespace: store.Namespace, Name: name}
	secret := &corev1.Secret{}
	switch err := r.Connector.Secrets.Get(ctx, key, secret); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read Secret %s: %w", key, err)
	}
	return secret, nil
}

// union is the sorted names of a and b, once each; nil when empty (as an
// omitted status field reads back).
func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil
	}
	return out
}

// reader reads from the API server itself when the manager gave one, else
// through the client.
func (r *MemoryStoreReconciler) reader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}
