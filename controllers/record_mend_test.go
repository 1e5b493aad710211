package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/storerecord"
)

// A store's record deleted — its ConfigMaps removed by a clean-up of the
// namespace — after a completed request object was deleted: only the
// ledger still holds that erasure, and a restore of the database to before
// it would take that copy back too. The audit writes the erasure into the
// record again from the ledger, so that the restore is still erased again.
func TestALostRecordIsWrittenAgainFromTheLedger(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "record-lost")
	db, dump, er := dumpThenErase(t, e)
	deleteAndWaitGone(t, er)
	uid := string(er.UID)
	deleted := recordParts(t, e)
	if !recorded(t, e, uid) || len(deleted) == 0 {
		t.Fatalf("the store's record (%d part(s)) has no entry for the deleted request", len(deleted))
	}
	// The store's audits made the counter's series before anything was
	// mended: an alert on its increase sees the first one.
	if v, found := counterValue(t, "lethe_erasure_record_entries_mended_total", "namespace", e.ns); !found || v != 0 {
		t.Fatalf("lethe_erasure_record_entries_mended_total for the store before the mend: %v (exported: %v), want 0", v, found)
	}
	// What `kubectl delete configmap -l erasure.lethe.dev/erasure-record`
	// does: every part of the record.
	if err := k8s.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(e.ns), client.MatchingLabels{storerecord.LabelStore: e.store.Name}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		parts := recordParts(t, e)
		for u := range parts {
			if deleted[u] {
				return fmt.Errorf("a deleted part of the record (ConfigMap uid %s) is still there", u)
			}
		}
		if !recorded(t, e, uid) {
			return fmt.Errorf("the record (%d part(s) written since its deletion) has no entry for the deleted request", len(parts))
		}
		return nil
	})
	assertRecordKeepsNoIDs(t, e, uid)
	eventually(t, 10*time.Second, func() error {
		if n := storeEvents(t, e.store, controllers.ReasonErasureRecordMended); n != 1 {
			return fmt.Errorf("%d %s events on the store, want 1", n, controllers.ReasonErasureRecordMended)
		}
		return nil
	})
	if v, _ := counterValue(t, "lethe_erasure_record_entries_mended_total", "namespace", e.ns); v != 1 {
		t.Errorf("lethe_erasure_record_entries_mended_total for the store: %v, want 1", v)
	}

	// The entry written from the ledger kept the erased sources: with the
	// ledger's source rows gone, the audit puts them back from it alone.
	tag, err := e.conn.Exec(ctx, `DELETE FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'source'`, uid)
	if err != nil || tag.RowsAffected() == 0 {
		t.Fatalf("deleting the request's source rows from the ledger: %d rows (%v), want some", tag.RowsAffected(), err)
	}
	eventually(t, 30*time.Second, func() error {
		if err := ingestErased(ctx, e.conn); !strings.Contains(fmt.Sprint(err), "LE002") {
			return fmt.Errorf("re-ingesting an erased transcript with the source rows gone: %s, want SQLSTATE LE002", fmt.Sprint(err))
		}
		return nil
	})

	// Putting the source rows back is itself a Resurrected event: the
	// restore's must come after it.
	eventually(t, 10*time.Second, func() error {
		if n := storeEvents(t, e.store, lethev1.ReasonResurrected); n < 1 {
			return fmt.Errorf("%d Resurrected events on the store after the source rows were put back, want 1", n)
		}
		return nil
	})
	resurrected := storeEvents(t, e.store, lethev1.ReasonResurrected)

	// The entry written again serves: the restore is erased again.
	waitCondition(t, e.store, lethev1.MemoryStoreErasuresIntact, metav1.ConditionTrue, lethev1.ReasonErasuresHeld)
	restoreDump(t, e, db, dump)
	eventually(t, 30*time.Second, func() error {
		if n := storeEvents(t, e.store, lethev1.ReasonResurrected); n <= resurrected {
			return fmt.Errorf("%d Resurrected events on the store, want more than the %d before the restore", n, resurrected)
		}
		if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, []string{erasedA, erasedA2}); n != 0 {
			return fmt.Errorf("%d restored sessions of the deleted request remain", n)
		}
		return nil
	})
	for _, id := range []string{erasedA, erasedA2} {
		var erased bool
		if err := e.conn.QueryRow(ctx, `SELECT lethe.is_erased('session', $1)`, id).Scan(&erased); err != nil || !erased {
			t.Errorf("session %s: the ledger does not hold it erased again (%v)", id, err)
		}
	}
	if n := e.sessionRows(t, keptB); n == 0 {
		t.Error("the kept session went with the re-erasure")
	}
	// The entry written from the ledger kept the erased sources too.
	if err := ingestErased(ctx, e.conn); !strings.Contains(fmt.Sprint(err), "LE002") {
		t.Errorf("re-ingesting an erased transcript after the restore: %v, want SQLSTATE LE002", err)
	}
}

// recordParts are the UIDs of the store's record ConfigMaps.
func recordParts(t *testing.T, e *memoryEnv) map[types.UID]bool {
	t.Helper()
	cms := &corev1.ConfigMapList{}
	if err := k8s.List(context.Background(), cms, client.InNamespace(e.ns), client.MatchingLabels{storerecord.LabelStore: e.store.Name}); err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]bool{}
	for _, cm := range cms.Items {
		out[cm.UID] = true
	}
	return out
}
