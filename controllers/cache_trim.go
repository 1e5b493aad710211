package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// CacheOptions is the manager's cache: managedFields dropped from every
// object when stripManagedFields is set (the controllers never read them),
// and requests past their deletion kept without their evidence but, while
// they wait for their Backups, the latest expiration among them
// (trimErasureRequests). The cache holds every request ever applied, so what a
// completed one keeps there is most of the manager's memory at 10,000 (P3).
func CacheOptions(stripManagedFields bool) cache.Options {
	var strip toolscache.TransformFunc
	if stripManagedFields {
		strip = cache.TransformStripManagedFields()
	}
	return cache.Options{
		DefaultTransform: strip,
		ByObject: map[client.Object]cache.ByObject{
			&lethev1.ErasureRequest{}: {Transform: trimErasureRequests(strip)},
		},
	}
}

// trimmedInCache reports whether the cached copy of er lacks its history,
// its evidence and its receipt's envelope and inclusion proof: it does once
// the request is past its deletion. Every pass on such a request reads the
// whole, latest object uncached (Reconcile); every other reader of the
// cache (the store audit, the reaper, the store finalizer, the metrics, the
// Velero watch, heldCheckpoints) reads only metadata, spec, conditions,
// phase, plan and the receipt's digest and log checkpoint, which are kept,
// and, until the Backups are rotated, the one that expires last (the
// metrics' projection of when they expire: backupsInCache).
//
// It looks only at what trimming keeps, so it says the same of the object
// before and after trimming.
func trimmedInCache(er *lethev1.ErasureRequest) bool {
	return meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionDeleted)
}

// trimErasureRequests applies next, then trims a request past its deletion
// (trimmedInCache). A transform may change the object in place: it comes
// fresh from the watch's decoder and nothing else holds it yet.
func trimErasureRequests(next toolscache.TransformFunc) toolscache.TransformFunc {
	return func(obj any) (any, error) {
		if next != nil {
			var err error
			if obj, err = next(obj); err != nil {
				return obj, err
			}
		}
		er, ok := obj.(*lethev1.ErasureRequest)
		if !ok || !trimmedInCache(er) {
			return obj, nil
		}
		st := &er.Status
		st.History, st.Evidence = nil, backupsInCache(er)
		if rc := st.Receipt; rc != nil {
			kept := &lethev1.Receipt{Digest: rc.Digest, KeyID: rc.KeyID, IssuedAt: rc.IssuedAt}
			if l := rc.Log; l != nil {
				kept.Log = &lethev1.LogInclusion{Index: l.Index, HistoryLength: l.HistoryLength, Checkpoint: l.Checkpoint}
			}
			st.Receipt = kept
		}
		return er, nil
	}
}

// backupsInCache is the evidence a trimmed request keeps: while its Backups
// are not rotated yet, the one of them not gone that expires last, with
// its name and expiration only (what the metrics' projection reads:
// lastToExpire); else none.
func backupsInCache(er *lethev1.ErasureRequest) *lethev1.ErasureEvidence {
	if er.Status.Phase == lethev1.PhaseBackupsRotated || meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionBackupsRotated) {
		return nil
	}
	last, ok := lastToExpire(er)
	if !ok {
		return nil
	}
	kept := lethev1.BackupEvidence{Name: last.Name, Expiration: last.Expiration}
	return &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{{Step: lethev1.ConditionBackupsRotated, Backups: []lethev1.BackupEvidence{kept}}}}
}
