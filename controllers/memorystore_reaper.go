package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/metrics"
	"github.com/lethe-dev/lethe/internal/postgres"
)

const (
	// DefaultReapMinAge is how old a tombstone must be before the reaper
	// looks at it: a request created a moment ago may not be in the
	// manager's cache yet.
	DefaultReapMinAge = 2 * time.Minute
	// ReasonTombstonesReaped is the store's event when the reaper ended tombstones.
	ReasonTombstonesReaped = "TombstonesReaped"
)

// reapTombstones ends the tombstones whose ErasureRequest is gone — a crash
// between the tombstone's commit and the status write and then the
// request deleted, a store deleted before its requests, two overlapping
// requests cancelled at once — the way the ledger says: lifted when the
// deletion never started, the deletion finished (and recorded, and the
// graph pruned) when it had. No tombstone is a soft delete that lasts.
// It sets the gauge of the store's tombstoned sessions.
// A deletion is finished only when the schema is compliant (finishing
// could leave rows behind otherwise); lifting needs nothing. Tombstones of
// an erasure a restore took back, which a record holds, are neither: the
// store's audit erases them again. It returns how many requests' such
// tombstones it left.
func (r *MemoryStoreReconciler) reapTombstones(ctx context.Context, store *lethev1.MemoryStore, compliant bool) (int, error) {
	ledger, err := r.Connector.Ledger(ctx, store)
	if err != nil {
		return 0, err
	}
	// The gauges first: a reap that fails must not leave them stale.
	if err := setTombstoneGauges(ctx, store, ledger); err != nil {
		return 0, err
	}
	holds, err := ledger.HeldTombstones(ctx, r.reapMinAge())
	if err != nil {
		return 0, err
	}
	left := 0
	if len(holds) > 0 {
		if left, err = r.reapGone(ctx, store, ledger, holds, compliant); err != nil {
			return 0, err
		}
	}
	return left, setTombstoneGauges(ctx, store, ledger)
}

// reapGone reaps the holds whose request is gone, but not those it must
// leave: a started deletion while the schema is not compliant, and a
// restored erasure a store's record holds. It returns how many of the
// latter it left.
func (r *MemoryStoreReconciler) reapGone(ctx context.Context, store *lethev1.MemoryStore, ledger *postgres.Eraser, holds []erasure.TombstoneHold, compliant bool) (int, error) {
	live, err := r.requestUIDs(ctx)
	if err != nil {
		return 0, err
	}
	var erased map[string]bool
	left := 0
	for _, h := range holds {
		if live[h.UID] || h.Started && !compliant {
			continue
		}
		if !h.Started {
			if erased == nil {
				if erased, err = r.recordedUIDs(ctx); err != nil {
					return 0, err
				}
			}
			if erased[h.UID] {
				// A record says this request was erased: its rows in force
				// came back with a restore. Lifting them would make the
				// sessions readable and cancel what the store's audit erases
				// again (checkRecord); they stay hidden until it does.
				left++
				continue
			}
		}
		if err := r.reap(ctx, store, ledger, h); err != nil {
			return 0, err
		}
	}
	return left, nil
}

// setTombstoneGauges reads the store's tombstones into its gauges.
func setTombstoneGauges(ctx context.Context, store *lethev1.MemoryStore, ledger *postgres.Eraser) error {
	st, err := ledger.Tombstones(ctx)
	if err != nil {
		return err
	}
	metrics.TombstonedSessions.WithLabelValues(store.Namespace, store.Name).Set(float64(st.Sessions))
	metrics.TombstoneOverdue.WithLabelValues(store.Namespace, store.Name).Set(st.Overdue.Seconds())
	return nil
}

// requestUIDs are the UIDs of every ErasureRequest in the cluster: a store's
// database may be shared by stores in other namespaces.
func (r *MemoryStoreReconciler) requestUIDs(ctx context.Context) (map[string]bool, error) {
	list := &lethev1.ErasureRequestList{}
	// Only the UIDs are read: no copy of every request in the cluster.
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(list.Items))
	for _, er := range list.Items {
		out[string(er.UID)] = true
	}
	return out, nil
}

// recordedUIDs are the requests every store's record holds as erased
// (none when no record is kept). Records that cannot be read are an
// error: nothing is lifted on a guess.
func (r *MemoryStoreReconciler) recordedUIDs(ctx context.Context) (map[string]bool, error) {
	if r.Records == nil {
		return map[string]bool{}, nil
	}
	uids, err := r.Records.Keeper.RecordedUIDs(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the erasure records before reaping: %w", err)
	}
	return uids, nil
}

// reap ends one gone request's tombstones.
func (r *MemoryStoreReconciler) reap(ctx context.Context, store *lethev1.MemoryStore, ledger *postgres.Eraser, h erasure.TombstoneHold) error {
	if !h.Started {
		c, err := ledger.Cancel(ctx, h.UID)
		if err == nil {
			metrics.TombstonesReaped.WithLabelValues(store.Namespace, store.Name, "lifted").Add(float64(c.Lifted))
			r.Recorder.Eventf(store, nil, corev1.EventTypeNormal, ReasonTombstonesReaped, "Reap",
				"request %s is gone and its deletion never started: %d tombstone(s) lifted (Cancelled receipt)", h.UID, c.Lifted)
			return nil
		}
		if !errors.Is(err, erasure.ErrTooLateToCancel) {
			return err
		}
	}
	// Once the deletion is done the hold is gone and nothing would record
	// it again: a record that cannot be written leaves it held.
	if r.Records != nil {
		if err := r.Records.Keeper.Writable(ctx, store.Namespace, store.Name); err != nil {
			return err
		}
	}
	// The request's whole session list, as its own deletion chunked it, so
	// that each batch keeps its receipt key; erased sessions are skipped.
	done, err := ledger.ErasedSessions(ctx, h.UID)
	if err != nil {
		return err
	}
	all := slices.Sorted(slices.Values(append(done, h.SessionIDs...)))
	res, err := ledger.Delete(ctx, erasure.Request{UID: h.UID, SessionIDs: all}, max(r.BatchSize, 1), 0)
	if err != nil {
		return err
	}
	deleted := 0
	for _, b := range res.Batches {
		deleted += b.Sessions
	}
	erased, err := ledger.ErasedSessions(ctx, h.UID)
	if err != nil {
		return err
	}
	if err := r.Connector.PruneGraph(ctx, store, erased); err != nil {
		return err
	}
	if err := r.Records.AddErased(ctx, store, types.UID(h.UID), r.Clock.Now(), erased); err != nil {
		return err
	}
	metrics.TombstonesReaped.WithLabelValues(store.Namespace, store.Name, "deleted").Add(float64(deleted))
	metrics.TombstoneReaperRows.Add(float64(deleted))
	r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, ReasonTombstonesReaped, "Reap",
		"request %s is gone after its deletion started: %d session(s) deleted (Deleted receipts), the graph pruned, the store's record kept; its Backups were not rotated", h.UID, deleted)
	return nil
}
