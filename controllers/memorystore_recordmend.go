package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/metrics"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/storerecord"
)

const (
	// ReasonErasureRecordMended is the store's event when its audit wrote
	// again, from the ledger, erasures that no record in the cluster held.
	ReasonErasureRecordMended = "ErasureRecordMended"
	// mendBatch bounds the entries one audit writes into a record, and
	// the requests one statement reads: the rest wait for the next audits.
	mendBatch = 500
)

// mendRecord writes into the store's record, from the database's ledger,
// the erasures of requests whose object is gone that no record in the
// cluster holds: a record's last parts or the whole record deleted, entries
// removed, the reaper's record write failing after its deletion committed.
// A later restore of the database would bring those back unseen. The
// ledger is the record's other copy: a restore takes it back, a lost record
// part does not, so each mends what the other lost. A request still
// holding tombstones is the reaper's to finish and record; one erased less
// than the reaper's minimum age ago, its own writers'. At most mendBatch
// entries an audit; the rest at the next.
func (r *MemoryStoreReconciler) mendRecord(ctx context.Context, store *lethev1.MemoryStore, rec storerecord.Record) error {
	ledger, err := r.Connector.Ledger(ctx, store)
	if err != nil {
		return err
	}
	missing, err := r.unrecorded(ctx, ledger, rec)
	if err != nil || len(missing) == 0 {
		return err
	}
	entries, err := r.entriesFromLedger(ctx, ledger, missing)
	if err != nil || len(entries) == 0 {
		return err
	}
	if err := r.Records.Keeper.AddAll(ctx, store.Namespace, store.Name, entries); err != nil {
		return fmt.Errorf("write %d erasure(s) from the ledger into the store's record: %w", len(entries), err)
	}
	metrics.RecordEntriesMended.WithLabelValues(store.Namespace, store.Name).Add(float64(len(entries)))
	logf.FromContext(ctx).Info("erasures of gone requests that no record held written into the store's record from the ledger", "entries", len(entries))
	r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, ReasonErasureRecordMended, "Audit",
		"%d erasure(s) of gone requests that the ledger holds were in no erasure record (a record part deleted, entries removed, or a record write lost): written again from the ledger", len(entries))
	return nil
}

// entriesFromLedger reads, mendBatch requests of missing per statement,
// the entries of up to mendBatch of them, leaving out those the reaper or
// the request's own writers have still to record.
func (r *MemoryStoreReconciler) entriesFromLedger(ctx context.Context, ledger *postgres.Eraser, missing []string) (map[string]func([]byte) storerecord.Entry, error) {
	settled := r.Clock.Now().Add(-r.reapMinAge())
	entries := map[string]func([]byte) storerecord.Entry{}
	for chunk := range slices.Chunk(missing, mendBatch) {
		erasures, err := ledger.LedgerErasures(ctx, chunk)
		if err != nil {
			return nil, err
		}
		for _, le := range erasures {
			if le.Held > 0 || len(le.Sessions) == 0 || le.DeletedAt.After(settled) {
				continue
			}
			entries[le.UID] = func(key []byte) storerecord.Entry {
				return storerecord.NewEntry(key, le.DeletedAt, le.Sessions, le.Sources, le.SourcesKey)
			}
			if len(entries) == mendBatch {
				return entries, nil
			}
		}
	}
	return entries, nil
}

// unrecorded are the requests the ledger says erased sessions of the
// store's tenant that no request object and no store's record in the
// cluster holds, sorted. The cluster's records are read only when rec and
// the request objects leave some.
func (r *MemoryStoreReconciler) unrecorded(ctx context.Context, ledger *postgres.Eraser, rec storerecord.Record) ([]string, error) {
	erased, err := ledger.ErasedRequests(ctx)
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
