// Package controllers holds Lethe's reconcilers: the MemoryStore controller
// (connectivity, schema audit, graph sweep) and the ErasureRequest
// controller, which drives the phase machine of internal/erasure.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/metrics"
)

// VeleroDetector reports whether Velero's CRDs are served.
type VeleroDetector interface {
	Installed(ctx context.Context) (bool, error)
}

// MemoryStoreReconciler checks that a MemoryStore's layers are reachable and
// audits its schema with the decision record's validation queries. It never
// changes the memory database.
type MemoryStoreReconciler struct {
	// Client reads MemoryStores from the cache and writes their status.
	Client   client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	// Connector opens the store's databases and graph; its Secrets reader
	// reads straight from the API server, in the store's namespace only.
	Connector *connector.Connector
	Velero    VeleroDetector
	// Reverify, when set, receives the requests whose erasures an audit
	// found lost (a restore), so they erase again at once.
	Reverify chan<- event.TypedGenericEvent[client.Object]
	// Records keeps each store's record of what was erased; nil: none kept.
	Records *ErasureRecords
	// ReapMinAge is how old a tombstone whose request is gone must be before
	// the reaper ends it (DefaultReapMinAge when zero).
	ReapMinAge time.Duration
	// BatchSize bounds the sessions one deletion transaction of the reaper
	// covers: the requests' own, so that its batches keep their receipt keys.
	BatchSize int

	// RecheckInterval is how often a Ready store is probed again; a store that
	// is not Ready is retried sooner (NotReadyRetry).
	RecheckInterval time.Duration
	NotReadyRetry   time.Duration
	// ProbeTimeout bounds each external check.
	ProbeTimeout time.Duration
	// SweepTimeout bounds one full graph reconciliation.
	SweepTimeout time.Duration
	// RedactionSample bounds the values of each redacted column an audit
	// reads (RedactionCompliant); 0 checks the triggers only.
	RedactionSample int
	// SweepMaxOrphanFraction refuses a sweep that would remove more than
	// this fraction of the graph's sessions or facts (0 or 1: no limit).
	SweepMaxOrphanFraction float64
	// ReceiptKeySet is the ConfigMap the receipt keys are published in (the
	// --receipt-key-secret's namespace and name); empty: receipts are not
	// signed and no receipt log is checked. APIReader reads it.
	ReceiptKeySet types.NamespacedName
	APIReader     client.Reader

	// Withheld is shared with the ErasureRequest reconciler: the requests
	// whose receipt-log inclusion was left out, woken once the log is
	// consistent again (wakeUnlogged). Nil: none are woken.
	Withheld *WithheldInclusions

	keys publishedKeys
	// logWitnesses holds each store's *evidence.Witness (by its name).
	logWitnesses sync.Map
}

// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=memorystores,verbs=get;list;watch
// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=memorystores/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile observes the store, computes its conditions, and writes the
// status once, only when it changed.
func (r *MemoryStoreReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	store := &lethev1.MemoryStore{}
	if err := r.Client.Get(ctx, req.NamespacedName, store); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if err := r.ensureFinalizer(ctx, store); err != nil {
		return requeueOnConflict(err)
	}

	holdErr := r.holdSecretsOf(ctx, store)
	facts := r.observe(ctx, store)

	before := store.DeepCopy()
	wasReady := meta.IsStatusConditionTrue(store.Status.Conditions, lethev1.MemoryStoreReady)
	intactWas := erasuresIntactWas(store)
	wasConsistent := !meta.IsStatusConditionFalse(store.Status.Conditions, lethev1.MemoryStoreReceiptLogConsistent)
	r.setStatus(store, facts)
	r.reportRestore(store, facts, intactWas != lethev1.ReasonRestoreDetected)
	r.reportKeyChange(store, facts, intactWas)
	r.reportReceiptLog(ctx, store, facts.receiptLog, wasConsistent)
	requeue := auditRetry(facts, r.sweepIfDue(ctx, store, facts), r.NotReadyRetry)

	if !equality.Semantic.DeepEqual(before.Status, store.Status) {
		if err := r.Client.Status().Patch(ctx, store, client.MergeFrom(before)); err != nil {
			return statusPatchFailed(err)
		}
	}
	r.wakeUnlogged(store)

	ready := meta.FindStatusCondition(store.Status.Conditions, lethev1.MemoryStoreReady)
	r.reportReadiness(ctx, store, ready, wasReady, before.Status.ObservedGeneration == 0)
	if !store.DeletionTimestamp.IsZero() {
		return r.release(ctx, store)
	}
	if holdErr != nil && onlyConflicts(holdErr) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}

	if ready.Status != metav1.ConditionTrue {
		return ctrl.Result{RequeueAfter: r.NotReadyRetry}, nil
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// setStatus writes the store's conditions, schema audit and observed
// generation from the observed facts, in memory only.
func (r *MemoryStoreReconciler) setStatus(store *lethev1.MemoryStore, facts storeFacts) {
	setConditions(&store.Status.Conditions, storeConditions(facts, store.Generation))
	if facts.schema != nil {
		next := schemaStatus(facts.schema, metav1.NewTime(r.Clock.Now()))
		// checkedAt records when this result was first seen, so an unchanged
		// audit does not rewrite the status on every pass.
		if prev := store.Status.Schema; prev != nil && sameSchema(prev, next) {
			next.CheckedAt = prev.CheckedAt
		}
		store.Status.Schema = next
	}
	store.Status.ObservedGeneration = store.Generation
}

// sweepIfDue sweeps the store's graph when its layers are healthy, its schema
// compliant and a sweep is due, and returns how long to wait before the next
// pass: the recheck interval, or sooner when the next sweep is due first.
func (r *MemoryStoreReconciler) sweepIfDue(ctx context.Context, store *lethev1.MemoryStore, facts storeFacts) time.Duration {
	requeue := r.RecheckInterval
	if facts.graphConfigured && facts.graph == nil && facts.postgres == nil &&
		meta.IsStatusConditionTrue(store.Status.Conditions, lethev1.MemoryStoreSchemaCompliant) {
		wait := r.sweepWait(store)
		if wait <= 0 {
			r.sweep(ctx, store)
			wait = r.waitAfterSweep(store)
		}
		requeue = min(requeue, wait)
	}
	return requeue
}

// statusPatchFailed is the result of a failed status patch: a conflict or a
// deleted store is retried in a second, any other error is returned.
func statusPatchFailed(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, fmt.Errorf("patch MemoryStore status: %w", err)
}

// reportReadiness records an Event and logs when the store's readiness
// changed, or on its first pass.
func (r *MemoryStoreReconciler) reportReadiness(ctx context.Context, store *lethev1.MemoryStore, ready *metav1.Condition, wasReady, firstPass bool) {
	if isReady := ready.Status == metav1.ConditionTrue; isReady != wasReady || firstPass {
		kind := corev1.EventTypeNormal
		if !isReady {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(store, nil, kind, ready.Reason, "Audit", "%s", ready.Message)
		ctrl.LoggerFrom(ctx).Info("memory store readiness changed", "ready", isReady, "reason", ready.Reason)
	}
}

// observe runs every external check of the store.
func (r *MemoryStoreReconciler) observe(ctx context.Context, store *lethev1.MemoryStore) storeFacts {
	var f storeFacts
	f.receiptLog.configured = r.ReceiptKeySet.Name != ""
	if err := r.Connector.CheckPostgres(ctx, store, r.ProbeTimeout); err != nil {
		f.postgres = failureOf(err)
	} else {
		r.observeDatabase(ctx, store, &f)
	}
	if store.Spec.FalkorDB != nil {
		f.graphConfigured = true
		if err := r.Connector.CheckGraph(ctx, store, r.ProbeTimeout, r.SweepTimeout); err != nil {
			f.graph = failureOf(err)
		} else if f.postgres == nil {
			nctx, ncancel := context.WithTimeout(ctx, r.ProbeTimeout)
			f.graphNames, f.graphNamesErr = r.Connector.SyncPersonNames(nctx, store)
			ncancel()
			pctx, pcancel := context.WithTimeout(ctx, r.SweepTimeout)
			if err := r.pruneGoneErasures(pctx, store); err != nil {
				// Retried on the next audit; the full sweep is the backstop.
				ctrl.LoggerFrom(ctx).Error(err, "prune the graph elements of gone requests' erased sessions")
			}
			pcancel()
		}
	}
	if store.Spec.Velero != nil {
		f.veleroConfigured = true
		installed, err := r.Velero.Installed(ctx)
		if err != nil {
			f.velero = fail(lethev1.ReasonConnectionFailed, "cannot ask the API server for Velero's APIs: %v", err)
		}
		f.veleroInstalled = installed
	}
	return f
}

// observeDatabase runs the checks of the store's database, once it answers:
// the schema, erasures, redaction, parameter logging and receipt log
// audits, and the reaper.
func (r *MemoryStoreReconciler) observeDatabase(ctx context.Context, store *lethev1.MemoryStore, f *storeFacts) {
	actx, cancel := context.WithTimeout(ctx, r.ProbeTimeout)
	rep, err := r.Connector.AuditSchema(actx, store)
	cancel()
	if err != nil {
		f.schemaErr = err
	} else {
		f.schema = &rep
	}
	ectx, ecancel := context.WithTimeout(ctx, r.ProbeTimeout)
	f.erasuresErr = r.checkErasures(ectx, store, f)
	ecancel()
	if f.erasuresErr != nil {
		// The condition says only that the check failed; the cause is here.
		ctrl.LoggerFrom(ctx).Error(f.erasuresErr, "check the erasures of the store's requests")
	} else {
		metrics.StoreLastAudit.WithLabelValues(store.Namespace, store.Name).Set(float64(r.Clock.Now().Unix()))
	}
	if f.record != nil {
		// Apart from the check, with its own time: a mend that fails is
		// logged and leaves the check's result as it is (the next audit
		// mends again).
		mctx, mcancel := context.WithTimeout(ctx, r.ProbeTimeout)
		if err := r.mendRecord(mctx, store, *f.record); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "write the erasures no record holds into the store's record from the ledger")
		}
		mcancel()
	}
	rctx, rcancel := context.WithTimeout(ctx, r.ProbeTimeout)
	f.redaction, f.redactionErr = r.Connector.AuditRedaction(rctx, store, r.RedactionSample)
	rcancel()
	pctx, pcancel := context.WithTimeout(ctx, r.ProbeTimeout)
	f.paramLog, f.paramLogErr = r.Connector.AuditParameterLogging(pctx, store)
	pcancel()
	lctx, lcancel := context.WithTimeout(ctx, r.ProbeTimeout)
	f.receiptLog = r.checkReceiptLog(lctx, store)
	lcancel()
	if f.receiptLog.err != nil {
		// The condition says only that the check failed; the cause is here.
		ctrl.LoggerFrom(ctx).Error(f.receiptLog.err, "check the store's receipt log against the checkpoints its requests hold")
	}
	if _, err := r.reapTombstones(ctx, store, f.schema != nil && f.schema.Compliant()); err != nil {
		// Retried on the next audit; the tombstones keep hiding the sessions meanwhile.
		ctrl.LoggerFrom(ctx).Error(err, "reap tombstones whose request is gone")
	}
}

// failureOf is the condition reason and message of a failed check: a
// configuration error's own, else ConnectionFailed with the error's text.
func failureOf(err error) *failure {
	var ce *erasure.ConfigError
	if errors.As(err, &ce) {
		return fail(ce.Reason, "%s", ce.Message)
	}
	return fail(lethev1.ReasonConnectionFailed, "%v", err)
}

// forget drops the cached connections of a deleted store, and its count of
// elements without provenance, which would otherwise be reported for good.
func (r *MemoryStoreReconciler) forget(key types.NamespacedName) {
	r.Connector.Forget(key)
	r.logWitnesses.Delete(key)
	labels := prometheus.Labels{"namespace": key.Namespace, "store": key.Name}
	metrics.GraphProvenanceless.DeletePartialMatch(labels)
	metrics.TombstonedSessions.Delete(labels)
	metrics.TombstoneOverdue.Delete(labels)
	forgetAudits(key)
	metrics.GraphSweepLastCompletion.Delete(labels)
	metrics.RestoresDetected.Delete(labels)
	metrics.RecordEntriesMended.Delete(labels)
}

// forgetAudits drops the store's audit time: a store gone, or released
// while another finalizer keeps it, is audited no more, and its age must
// not raise LetheStoreAuditOverdue.
func forgetAudits(key types.NamespacedName) {
	labels := prometheus.Labels{"namespace": key.Namespace, "store": key.Name}
	metrics.StoreLastAudit.Delete(labels)
	metrics.ErasuresUnderAnotherKey.Delete(labels)
}

func sameSchema(a, b *lethev1.SchemaStatus) bool {
	x, y := *a, *b
	x.CheckedAt, y.CheckedAt = nil, nil
	return equality.Semantic.DeepEqual(x, y)
}

// SetupWithManager registers the reconciler. Status writes do not trigger a
// new pass (generation predicate); the periodic recheck does.
func (r *MemoryStoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.RecheckInterval == 0 {
		r.RecheckInterval = 5 * time.Minute
	}
	if r.NotReadyRetry == 0 {
		r.NotReadyRetry = 30 * time.Second
	}
	if r.SweepTimeout == 0 {
		r.SweepTimeout = 30 * time.Minute
	}
	if r.ProbeTimeout == 0 {
		r.ProbeTimeout = 10 * time.Second
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&lethev1.MemoryStore{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("memorystore").
		Complete(r)
}
