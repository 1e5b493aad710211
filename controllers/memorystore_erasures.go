package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/metrics"
)

// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=erasurerequests,verbs=get;list;watch

// checkErasures compares what the store's requests past their deletion say
// they erased (kept by the API server) with what the database holds: a
// restore of the database brings erased sessions back and takes the ledger
// back with them. The store's record does the same for requests whose
// object is gone, and those are erased again here (no request is left to
// do it). Last, it counts the requests whose keyed ledger rows are under
// another erasure key than the database's: erasing again cannot mend
// those, only the key they were taken under. It sets what it found in f.
func (r *MemoryStoreReconciler) checkErasures(ctx context.Context, store *lethev1.MemoryStore, f *storeFacts) error {
	list := &lethev1.ErasureRequestList{}
	// Read from the cache without copying (the namespace's every request, each
	// audit); nothing here or in what it returns is changed.
	if err := r.Client.List(ctx, list, client.InNamespace(store.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	// The counters' series exist from the store's first audit, at 0.
	metrics.RestoresDetected.WithLabelValues(store.Namespace, store.Name).Add(0)
	metrics.RecordEntriesMended.WithLabelValues(store.Namespace, store.Name).Add(0)
	byUID := map[string]*lethev1.ErasureRequest{}
	var reqs []erasure.Request
	for i := range list.Items {
		er := &list.Items[i]
		if er.Spec.StoreRef.Name != store.Name || !meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionDeleted) {
			continue
		}
		byUID[string(er.UID)] = er
		reqs = append(reqs, erasure.FoundRequest(er))
	}
	findings, err := r.Connector.CheckErasures(ctx, store, reqs)
	if err != nil {
		return err
	}
	// A record that cannot be read (its key lost) fails the check, but
	// what the ledger alone says is still found and reported.
	var recordErr error
	if r.Records != nil {
		more, err := r.checkRecord(ctx, store, byUID, f)
		if err != nil {
			recordErr = fmt.Errorf("the store's erasure record: %w", err)
		} else {
			findings = mergeFindings(findings, more)
		}
	}
	// After the record put source rows back: they say their key too.
	if f.underAnotherKey, err = r.Connector.UnderOtherKeys(ctx, store); err != nil {
		return errors.Join(recordErr, err)
	}
	metrics.ErasuresUnderAnotherKey.WithLabelValues(store.Namespace, store.Name).Set(float64(f.underAnotherKey))
	f.restores = findings
	f.affected = make([]*lethev1.ErasureRequest, 0, len(findings))
	for _, fd := range findings {
		if er := byUID[fd.UID]; er != nil {
			f.affected = append(f.affected, er)
		}
	}
	return recordErr
}

// checkRecord records the live requests the store's record lacks, checks
// the database against every recorded erasure, and erases again those
// whose request object is gone. It keeps the record it read in f.
func (r *MemoryStoreReconciler) checkRecord(ctx context.Context, store *lethev1.MemoryStore, live map[string]*lethev1.ErasureRequest, f *storeFacts) ([]erasure.RestoreFinding, error) {
	rec, err := r.Records.Keeper.Load(ctx, store.Namespace, store.Name)
	if err != nil {
		return nil, err
	}
	f.record = &rec
	for uid, er := range live {
		if _, ok := rec.Entries[uid]; !ok {
			if err := r.Records.Add(ctx, store, er); err != nil {
				return nil, err
			}
		}
	}
	all, gone := recorded(rec, live)
	findings, err := r.Connector.CheckRecorded(ctx, store, all)
	if err != nil {
		return nil, err
	}
	for _, f := range findings {
		entry, ok := gone[f.UID]
		if !ok {
			// The request erases its sessions again itself; the sources
			// only the record still knows.
			if _, err := r.Connector.RestoreSources(ctx, store, recordedOf(f.UID, rec.Entries[f.UID])); err != nil {
				return nil, err
			}
			continue
		}
		res, err := r.Connector.ReeraseRecorded(ctx, store, recordedOf(f.UID, entry), rec.Matcher(entry))
		if err != nil {
			return nil, err
		}
		r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, lethev1.ReasonResurrected, "Erase",
			"recorded erasure %s (request object gone): %d session(s) erased again, %d ledger row(s) put back", f.UID, res.Sessions, res.LedgerRowsRestored)
	}
	return findings, nil
}

// mergeFindings adds to a the findings of b for requests a does not name.
func mergeFindings(a, b []erasure.RestoreFinding) []erasure.RestoreFinding {
	seen := map[string]bool{}
	for _, f := range a {
		seen[f.UID] = true
	}
	for _, f := range b {
		if !seen[f.UID] {
			a = append(a, f)
		}
	}
	return a
}

// reportRestore says, once per restore, that the database lost erasures,
// and asks each affected request to erase again now rather than at its next
// re-verification. Never blocks: a full queue leaves it to that interval.
func (r *MemoryStoreReconciler) reportRestore(store *lethev1.MemoryStore, facts storeFacts, wasIntact bool) {
	if len(facts.restores) == 0 {
		return
	}
	if wasIntact {
		metrics.RestoresDetected.WithLabelValues(store.Namespace, store.Name).Inc()
		var back, missing int64
		for _, f := range facts.restores {
			back += f.SessionsBack
			missing += f.LedgerRowsMissing
		}
		r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, lethev1.ReasonRestoreDetected, "Audit",
			"%d request(s) lost erasures: %d erased session(s) exist again, %d ledger row(s) gone; they erase again", len(facts.restores), back, missing)
	}
	for _, er := range facts.affected {
		select {
		case r.Reverify <- event.TypedGenericEvent[client.Object]{Object: er}:
		default:
		}
	}
}

// erasuresIntactWas is the reason of the store's ErasuresIntact condition
// when it is False, else empty: what the audits already reported.
func erasuresIntactWas(store *lethev1.MemoryStore) string {
	if c := meta.FindStatusCondition(store.Status.Conditions, lethev1.MemoryStoreErasuresIntact); c != nil && c.Status == metav1.ConditionFalse {
		return c.Reason
	}
	return ""
}

// reportKeyChange says, when the condition comes to say it, that requests
// hold ledger rows under another erasure key than the database's. No
// request can mend it by erasing again: a human puts the key back.
func (r *MemoryStoreReconciler) reportKeyChange(store *lethev1.MemoryStore, facts storeFacts, was string) {
	if was == lethev1.ReasonErasureKeyChanged || erasuresIntactWas(store) != lethev1.ReasonErasureKeyChanged {
		return
	}
	r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, lethev1.ReasonErasureKeyChanged, "Audit",
		"%d request(s) hold erasure ledger rows under another erasure key than the database's: their erased sources are no longer refused at ingestion", facts.underAnotherKey)
}

// auditRetry is how soon the store is audited again, given requeue (the
// recheck, or the next sweep): a failed erasure check, or a restore found,
// is audited again within retry. Until an audit re-erases them, the sessions
// of a request whose object is gone that a restore brought back stay
// readable (no request is left to erase them), and the audit that re-erases
// them still reports what it found before; the one after says whether the
// erasures hold.
func auditRetry(f storeFacts, requeue, retry time.Duration) time.Duration {
	if f.erasuresErr != nil || len(f.restores) > 0 {
		return min(requeue, retry)
	}
	return requeue
}
