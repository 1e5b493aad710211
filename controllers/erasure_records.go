package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/storerecord"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;create;update

// ErasureRecords writes each store's record of what its requests erased
// (internal/storerecord), which outlives the request objects.
type ErasureRecords struct {
	Keeper    *storerecord.Keeper
	Connector *connector.Connector
}

// Add records what er erased, once its deletion is done; a request already
// recorded is left as it is. store is nil when the MemoryStore is gone:
// the record then names the sessions without their sources.
func (e *ErasureRecords) Add(ctx context.Context, store *lethev1.MemoryStore, er *lethev1.ErasureRequest) error {
	deleted := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionDeleted)
	if e == nil || deleted == nil || deleted.Status != metav1.ConditionTrue {
		return nil
	}
	var sources []string
	var ledgerKey string
	if store != nil {
		var err error
		if sources, ledgerKey, err = e.Connector.SourceHashes(ctx, store, string(er.UID)); err != nil {
			return err
		}
	}
	found := erasure.FoundRequest(er).SessionIDs
	erasedAt := deleted.LastTransitionTime.Time
	return unlessNamespaceGoes(ctx, e.Keeper.Add(ctx, er.Namespace, er.Spec.StoreRef.Name, string(er.UID), func(key []byte) storerecord.Entry {
		return storerecord.NewEntry(key, erasedAt, found, sources, ledgerKey)
	}))
}

// AddErased records sessions erased for the request uid without its
// object (the reaper finished a deletion whose request was gone).
func (e *ErasureRecords) AddErased(ctx context.Context, store *lethev1.MemoryStore, uid types.UID, erasedAt time.Time, sessionIDs []string) error {
	if e == nil {
		return nil
	}
	sources, ledgerKey, err := e.Connector.SourceHashes(ctx, store, string(uid))
	if err != nil {
		return err
	}
	return unlessNamespaceGoes(ctx, e.Keeper.Add(ctx, store.Namespace, store.Name, string(uid), func(key []byte) storerecord.Entry {
		return storerecord.NewEntry(key, erasedAt, sessionIDs, sources, ledgerKey)
	}))
}

// unlessNamespaceGoes drops the error of a record write refused because
// the namespace is being deleted: the record lives there and goes with
// everything else in it, so nothing is left to keep it in (the database's
// ledger still holds the erasure). Waiting would hold the request's or the
// store's finalizer, and the namespace, for good.
func unlessNamespaceGoes(ctx context.Context, err error) error {
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		ctrl.LoggerFrom(ctx).Info("not kept in the store's erasure record: its namespace is being deleted")
		return nil
	}
	return err
}

// recorded is the store's record as the database checks see it; those
// whose request object still exists are marked live.
func recorded(rec storerecord.Record, live map[string]*lethev1.ErasureRequest) (all []erasure.Recorded, gone map[string]storerecord.Entry) {
	gone = map[string]storerecord.Entry{}
	for uid, e := range rec.Entries {
		all = append(all, recordedOf(uid, e))
		if live[uid] == nil {
			gone[uid] = e
		}
	}
	return all, gone
}

// recordedOf is the entry uid of the record as the database checks see it.
func recordedOf(uid string, e storerecord.Entry) erasure.Recorded {
	return erasure.Recorded{UID: uid, Sessions: len(e.Sessions), Sources: e.Sources, SourcesKey: e.LedgerKey}
}
