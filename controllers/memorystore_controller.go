// Package controllers holds Lethe's reconcilers: the MemoryStore controller
// (connectivity and schema audit) and, later, the ErasureRequest phase machine.
package controllers

import (
	"context"
	"fmt"
	"time"

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
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/jackc/pgx/v5/pgxpool"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"

	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
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
	Client client.Client
	// SecretReader reads Secrets straight from the API server: Lethe keeps no
	// cluster-wide Secret cache, and reads only in the store's namespace.
	SecretReader client.Reader
	Recorder     events.EventRecorder
	Clock        clock.PassiveClock

	Pools  *postgres.Pools
	Graphs *graph.Clients
	Velero VeleroDetector

	// RecheckInterval is how often a Ready store is probed again; a store that
	// is not Ready is retried sooner (NotReadyRetry).
	RecheckInterval time.Duration
	NotReadyRetry   time.Duration
	// ProbeTimeout bounds each external check.
	ProbeTimeout time.Duration
	// SweepTimeout bounds one full graph reconciliation.
	SweepTimeout time.Duration
	// SweepMaxOrphanFraction refuses a sweep that would remove more than
	// this fraction of the graph's sessions or facts (0 or 1: no limit).
	SweepMaxOrphanFraction float64
}

// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=memorystores,verbs=get;list;watch
// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=memorystores/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile observes the store, computes its conditions, and writes the
// status once, only when it changed.
func (r *MemoryStoreReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	store := &lethev1.MemoryStore{}
	if err := r.Client.Get(ctx, req.NamespacedName, store); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}

	facts := r.observe(ctx, store)

	before := store.DeepCopy()
	wasReady := meta.IsStatusConditionTrue(store.Status.Conditions, lethev1.MemoryStoreReady)
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
	requeue := r.RecheckInterval
	if facts.graphConfigured && facts.graph == nil && facts.postgres == nil &&
		meta.IsStatusConditionTrue(store.Status.Conditions, lethev1.MemoryStoreSchemaCompliant) {
		wait := r.sweepWait(store)
		if wait <= 0 {
			r.sweep(ctx, store, facts.graphHandle, facts.primary)
			wait = r.sweepWait(store)
		}
		requeue = min(requeue, wait)
	}

	if !equality.Semantic.DeepEqual(before.Status, store.Status) {
		if err := r.Client.Status().Patch(ctx, store, client.MergeFrom(before)); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			return ctrl.Result{}, fmt.Errorf("patch MemoryStore status: %w", err)
		}
	}

	ready := meta.FindStatusCondition(store.Status.Conditions, lethev1.MemoryStoreReady)
	if isReady := ready.Status == metav1.ConditionTrue; isReady != wasReady || before.Status.ObservedGeneration == 0 {
		kind := corev1.EventTypeNormal
		if !isReady {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(store, nil, kind, ready.Reason, "Audit", "%s", ready.Message)
		log.Info("memory store readiness changed", "ready", isReady, "reason", ready.Reason)
	}

	if ready.Status != metav1.ConditionTrue {
		return ctrl.Result{RequeueAfter: r.NotReadyRetry}, nil
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// observe runs every external check of the store.
func (r *MemoryStoreReconciler) observe(ctx context.Context, store *lethev1.MemoryStore) storeFacts {
	var f storeFacts
	spec := store.Spec

	f.primary, f.postgres = r.checkPostgres(ctx, store)
	if f.postgres == nil {
		actx, cancel := context.WithTimeout(ctx, r.ProbeTimeout)
		rep, err := postgres.AuditSchema(actx, f.primary, spec.Postgres.Schema)
		cancel()
		if err != nil {
			f.schemaErr = err
		} else {
			f.schema = &rep
		}
	}

	if spec.FalkorDB != nil {
		f.graphConfigured = true
		f.graphHandle, f.graph = r.checkGraph(ctx, store)
	}

	if spec.Velero != nil {
		f.veleroConfigured = true
		installed, err := r.Velero.Installed(ctx)
		if err != nil {
			f.velero = fail(lethev1.ReasonConnectionFailed, "cannot ask the API server for Velero's APIs: %v", err)
		}
		f.veleroInstalled = installed
	}
	return f
}

// checkPostgres connects to the primary and every replica and returns the
// primary's pool; a nil failure means all answered.
func (r *MemoryStoreReconciler) checkPostgres(ctx context.Context, store *lethev1.MemoryStore) (*pgxpool.Pool, *failure) {
	targets := []struct {
		name string
		ref  lethev1.SecretKeyRef
	}{{"primary", store.Spec.Postgres.DSNSecretRef}}
	for i, rep := range store.Spec.Postgres.Replicas {
		targets = append(targets, struct {
			name string
			ref  lethev1.SecretKeyRef
		}{fmt.Sprintf("replica %d", i), rep.DSNSecretRef})
	}
	var primary *pgxpool.Pool
	for _, t := range targets {
		dsn, f := readSecretKey(ctx, r.SecretReader, store.Namespace, t.ref)
		if f != nil {
			f.message = t.name + ": " + f.message
			return nil, f
		}
		pctx, cancel := context.WithTimeout(ctx, r.ProbeTimeout)
		pool, err := r.Pools.Get(pctx, poolKey(store, t.name), dsn)
		if err == nil {
			err = pool.Ping(pctx)
		}
		cancel()
		if err != nil {
			return nil, fail(lethev1.ReasonConnectionFailed, "%s: %v", t.name, err)
		}
		if primary == nil {
			primary = pool
		}
	}
	return primary, nil
}

// checkGraph pings FalkorDB and makes sure the provenance indexes exist; it
// returns the store's graph when both succeeded.
func (r *MemoryStoreReconciler) checkGraph(ctx context.Context, store *lethev1.MemoryStore) (*graph.Graph, *failure) {
	g, f := storeGraph(ctx, r.SecretReader, r.Graphs, store)
	if f != nil {
		return nil, f
	}
	pctx, cancel := context.WithTimeout(ctx, r.ProbeTimeout)
	defer cancel()
	if err := g.Ping(pctx); err != nil {
		return nil, fail(lethev1.ReasonConnectionFailed, "%v", err)
	}
	// The provenance indexes exist before the first erasure needs them
	// (remembered per client: only the first check creates them). Building
	// them on a large graph takes seconds, hence the sweep's timeout.
	ictx, icancel := context.WithTimeout(ctx, r.SweepTimeout)
	defer icancel()
	if err := g.EnsureIndexes(ictx); err != nil {
		return nil, fail(lethev1.ReasonConnectionFailed, "the provenance indexes could not be created: %v", err)
	}
	return g, nil
}

// forget drops the cached connections of a deleted store.
func (r *MemoryStoreReconciler) forget(key types.NamespacedName) {
	r.Pools.ForgetPrefix(key.String() + "/")
	r.Graphs.Forget(key.String() + "/graph")
}

// poolKey names a cached connection by store and target.
func poolKey(store *lethev1.MemoryStore, target string) string {
	return store.Namespace + "/" + store.Name + "/" + target
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
