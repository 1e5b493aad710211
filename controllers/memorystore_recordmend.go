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
	// mendBatch bounds the entries one audit writes into a record: the
	// rest are written by the audits after it.
	mendBatch = 500
)

// mendRecord writes into the store's own record, from the database's
// ledger, each erasure of a request whose object is gone that the record
// lacks. The ledger is the other copy of what was erased: a restore takes
// it back, a lost record part does not, so each mends what the other
// lost. Those no record in the cluster held were lost (a record part
// deleted, entries edited away, the reaper's record write failing after
// its deletion committed): a later restore of the database would have
// brought them back unseen, and they are counted and reported. Those
// another record holds (a store sharing the database, a store renamed,
// whose record no audit reads) are adopted quietly, so that this store's
// audit alone covers its database. A request still holding tombstones is
// the reaper's to finish and record; one erased less than the reaper's
// minimum age ago, its own writers'.
func (r *MemoryStoreReconciler) mendRecord(ctx context.Context, store *lethev1.MemoryStore, rec storerecord.Record) error {
	ledger, err := r.Connector.Ledger(ctx, store)
	if err != nil {
		return err
	}
	missing, err := r.unrecorded(ctx, ledger, rec)
	if err != nil || len(missing) == 0 {
		return err
	}
	elsewhere, err := r.Records.Keeper.RecordedUIDs(ctx)
	if err != nil {
		return err
	}
	entries, err := r.entriesFromLedger(ctx, ledger, missing)
	if err != nil || len(entries) == 0 {
		return err
	}
	if err := r.Records.Keeper.AddAll(ctx, store.Namespace, store.Name, entries); err != nil {
		return fmt.Errorf("write %d erasure(s) from the ledger into the store's record: %w", len(entries), err)
	}
	lost := 0
	for uid := range entries {
		if !elsewhere[uid] {
			lost++
		}
	}
	logf.FromContext(ctx).Info("erasures of gone requests written into the store's record from the ledger", "entries", len(entries), "inNoRecord", lost)
	if lost > 0 {
		metrics.RecordEntriesMended.WithLabelValues(store.Namespace, store.Name).Add(float64(lost))
		r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, ReasonErasureRecordMended, "Audit",
			"%d erasure(s) of gone requests that the ledger holds were in no erasure record (a record part deleted or edited, or a record write lost): written again from the ledger", lost)
	}
	return nil
}

// unrecorded are the requests the ledger says erased sessions of the
// store's tenant that neither rec nor a request object holds, sorted, the
// first mendBatch of them.
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
	erased = slices.DeleteFunc(erased, func(uid string) bool { return live[uid] })
	return erased[:min(len(erased), mendBatch)], nil
}

// entriesFromLedger reads what each request of uids erased from the
// ledger, leaving out those the reaper or the request's own writers still
// have to record.
func (r *MemoryStoreReconciler) entriesFromLedger(ctx context.Context, ledger *postgres.Eraser, uids []string) (map[string]func([]byte) storerecord.Entry, error) {
	out := map[string]func([]byte) storerecord.Entry{}
	settled := r.Clock.Now().Add(-r.reapMinAge())
	for _, uid := range uids {
		held, err := ledger.HeldBy(ctx, uid)
		if err != nil {
			return nil, err
		}
		at, err := ledger.DeletedAt(ctx, uid)
		if err != nil {
			return nil, err
		}
		if held > 0 || at.After(settled) {
			continue
		}
		sessions, err := ledger.ErasedSessions(ctx, uid)
		if err != nil {
			return nil, err
		}
		sources, ledgerKey, err := ledger.SourceHashes(ctx, uid)
		if err != nil {
			return nil, err
		}
		out[uid] = func(key []byte) storerecord.Entry {
			return storerecord.NewEntry(key, at, sessions, sources, ledgerKey)
		}
	}
	return out, nil
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
