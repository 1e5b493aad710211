package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
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
// back with them. It returns the findings and the requests they concern.
func (r *MemoryStoreReconciler) checkErasures(ctx context.Context, store *lethev1.MemoryStore) ([]erasure.RestoreFinding, []*lethev1.ErasureRequest, error) {
	list := &lethev1.ErasureRequestList{}
	if err := r.Client.List(ctx, list, client.InNamespace(store.Namespace)); err != nil {
		return nil, nil, err
	}
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
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	findings, err := r.Connector.CheckErasures(ctx, store, reqs)
	if err != nil {
		return nil, nil, err
	}
	affected := make([]*lethev1.ErasureRequest, 0, len(findings))
	for _, f := range findings {
		if er := byUID[f.UID]; er != nil {
			affected = append(affected, er)
		}
	}
	return findings, affected, nil
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
