package controllers

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;patch

// SecretFinalizer holds a Secret a MemoryStore reads (its database's and
// replicas' DSNs, its graph's URL) until the store is released. A namespace
// deleted at once deletes its Secrets with everything else, and without
// them the requests' and the store's finalizers could neither lift
// tombstones, finish a claimed deletion nor mirror a proof: the namespace
// stayed Terminating for good. Lethe changes nothing else of a Secret (the
// ValidatingAdmissionPolicy shipped with it refuses any other change by
// its service account).
const SecretFinalizer = "erasure.lethe.dev/store-secret"

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

// holdSecrets puts SecretFinalizer on each Secret the store reads that its
// status does not list as held yet, and takes it off each Secret listed
// that the store no longer reads (unless another store of the namespace
// does). It updates store.Status.HeldSecrets in memory; the caller writes
// the status. A Secret missing or already being deleted is not held (the
// store's conditions say what is wrong with it) and is tried again at the
// next audit.
func (r *MemoryStoreReconciler) holdSecrets(ctx context.Context, store *lethev1.MemoryStore) error {
	wanted := readSecrets(store)
	held := slices.Clone(store.Status.HeldSecrets)
	for _, name := range wanted {
		if slices.Contains(held, name) {
			continue
		}
		ok, err := r.holdSecret(ctx, types.NamespacedName{Namespace: store.Namespace, Name: name})
		if err != nil {
			return err
		}
		if ok {
			held = append(held, name)
		}
	}
	for _, name := range slices.Clone(held) {
		if slices.Contains(wanted, name) {
			continue
		}
		if err := r.releaseSecret(ctx, store, name); err != nil {
			return err
		}
		held = slices.DeleteFunc(held, func(n string) bool { return n == name })
	}
	slices.Sort(held)
	if len(held) == 0 {
		held = nil
	}
	store.Status.HeldSecrets = held
	return nil
}

// holdSecret puts SecretFinalizer on the Secret key, reporting whether it
// holds it now.
func (r *MemoryStoreReconciler) holdSecret(ctx context.Context, key types.NamespacedName) (bool, error) {
	secret := &corev1.Secret{}
	switch err := r.Connector.Secrets.Get(ctx, key, secret); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read Secret %s to hold it: %w", key, err)
	}
	if controllerutil.ContainsFinalizer(secret, SecretFinalizer) {
		return true, nil
	}
	if !secret.DeletionTimestamp.IsZero() {
		// The API server takes no new finalizer on an object being deleted.
		return false, nil
	}
	controllerutil.AddFinalizer(secret, SecretFinalizer)
	if err := patchFinalizers(ctx, r.Client, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("hold Secret %s: %w", key, err)
	}
	return true, nil
}

// releaseSecrets takes SecretFinalizer off every Secret the store held or
// reads, except those another store of the namespace still needs: the
// store's last step before its own finalizer goes.
func (r *MemoryStoreReconciler) releaseSecrets(ctx context.Context, store *lethev1.MemoryStore) error {
	names := append(readSecrets(store), store.Status.HeldSecrets...)
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if err := r.releaseSecret(ctx, store, name); err != nil {
			return err
		}
	}
	return nil
}

// releaseSecret takes SecretFinalizer off the Secret name of the store's
// namespace, unless another store there that is not released yet reads it.
func (r *MemoryStoreReconciler) releaseSecret(ctx context.Context, store *lethev1.MemoryStore, name string) error {
	others := &lethev1.MemoryStoreList{}
	if err := r.Client.List(ctx, others, client.InNamespace(store.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list the stores that may read Secret %s: %w", name, err)
	}
	for i := range others.Items {
		o := &others.Items[i]
		if o.UID == store.UID || !o.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(o, StoreFinalizer) {
			continue
		}
		if slices.Contains(readSecrets(o), name) || slices.Contains(o.Status.HeldSecrets, name) {
			return nil
		}
	}
	key := types.NamespacedName{Namespace: store.Namespace, Name: name}
	secret := &corev1.Secret{}
	switch err := r.Connector.Secrets.Get(ctx, key, secret); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("read Secret %s to release it: %w", key, err)
	}
	if !controllerutil.RemoveFinalizer(secret, SecretFinalizer) {
		return nil
	}
	if err := patchFinalizers(ctx, r.Client, secret); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("release Secret %s: %w", key, err)
	}
	return nil
}
