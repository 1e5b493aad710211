package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/metrics"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/storerecord"
)

// ReasonErasureRecordMended is the store's event when its audit wrote
// again, from the ledger, erasures that no record in the cluster held.
const ReasonErasureRecordMended = "ErasureRecordMended"

// mendRecord writes into the store's record, from the database's ledger,
// each finished erasure whose request object is gone and which no store's
// record in the cluster holds: a part of a record deleted (a clean-up of
// the namespace's ConfigMaps), entries edited away, or the reaper's record
// write lost after its deletion committed. A later restore of the database
// would otherwise bring those sessions back unseen. The ledger is the
// other copy of what was erased: a restore takes it back, a lost record
// part does not, so each mends what the other lost. Erasures younger than
// the reaper's minimum age are left to the writers racing to record them;
// a request still holding tombstones is the reaper's to finish and record.
// It returns how many it wrote.
func (r *MemoryStoreReconciler) mendRecord(ctx context.Context, store *lethev1.MemoryStore, rec storerecord.Record) (int, error) {
	ledger, err := r.Connector.Ledger(ctx, store)
	if err != nil {
		return 0, err
	}
	missing, err := r.unrecorded(ctx, ledger, rec)
	if err != nil || len(missing) == 0 {
		return 0, err
	}
	mended := 0
	for _, uid := range missing {
		if held, err := ledger.HeldBy(ctx, uid); err != nil || held > 0 {
			if err != nil {
				return mended, err
			}
			continue
		}
		sessions, err := ledger.ErasedSessions(ctx, uid)
		if err != nil {
			return mended, err
		}
		at, err := ledger.DeletedAt(ctx, uid)
		if err != nil {
			return mended, err
		}
		if err := r.Records.AddErased(ctx, store, types.UID(uid), at, sessions); err != nil {
			return mended, fmt.Errorf("write again the record entry of %s: %w", uid, err)
		}
		mended++
	}
	if mended > 0 {
		metrics.RecordEntriesMended.WithLabelValues(store.Namespace, store.Name).Add(float64(mended))
		logf.FromContext(ctx).Info("erasures missing from every erasure record written again from the ledger", "entries", mended)
		r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, ReasonErasureRecordMended, "Audit",
			"%d erasure(s) of gone requests that the ledger holds were in no erasure record (a record part deleted or edited, or a record write lost): written again from the ledger", mended)
	}
	return mended, nil
}

// unrecorded are the requests the ledger says erased sessions (longer ago
// than the reaper's minimum age) that neither rec, nor a request object,
// nor any store's record in the cluster holds. The cluster's records are
// read only when the store's own record and the requests leave some.
func (r *MemoryStoreReconciler) unrecorded(ctx context.Context, ledger *postgres.Eraser, rec storerecord.Record) ([]string, error) {
	erased, err := ledger.ErasedRequests(ctx, r.reapMinAge())
	if err != nil {
		return nil, err
	}
	erased = slices.DeleteFunc(erased, func(uid string) bool { _, ok := rec.Entries[uid]; return ok })
	if len(erased) == 0 {
		return nil, nil
	}
	live, err := r.requestUIDs(ctx)
	if err != nil {
		return nil, err
	}
	if erased = slices.DeleteFunc(erased, func(uid string) bool { return live[uid] }); len(erased) == 0 {
		return nil, nil
	}
	recorded, err := r.Records.Keeper.RecordedUIDs(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(erased, func(uid string) bool { return recorded[uid] }), nil
}

// reapMinAge is how old a tombstone or an erasure must be before the
// reaper or the record's mend acts on it: younger, its request may not be
// in the manager's cache yet, or its writer may be about to record it.
func (r *MemoryStoreReconciler) reapMinAge() time.Duration {
	if r.ReapMinAge > 0 {
		return r.ReapMinAge
	}
	return DefaultReapMinAge
}
