package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

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
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/pgvector/pgvector-go"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/backups"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/metrics"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// Finalizer lets Lethe act when a request is deleted: during the grace period
// the tombstones are lifted (and a Cancelled receipt written); after the
// deletion, removing the object undoes nothing and the receipts in the
// database remain.
const Finalizer = "erasure.lethe.dev/finalizer"

// ErasureRequestReconciler runs the erasure phase machine: an ordered list of
// idempotent steps (tombstone, grace, delete, graph, backups), stopping at the
// first one that is not done, with one status patch per pass.
type ErasureRequestReconciler struct {
	Client       client.Client
	APIReader    client.Reader
	SecretReader client.Reader
	Recorder     events.EventRecorder
	Clock        clock.PassiveClock
	Pools        *postgres.Pools
	Graphs       *graph.Clients
	// Velero tells whether Velero's CRDs are served (asked on every pass).
	Velero VeleroDetector
	// Rotator updates Velero's objects; by default Client writes, APIReader reads.
	Rotator backups.Rotator

	// ReverifyInterval is how often a completed request is checked for
	// resurrected sessions.
	ReverifyInterval time.Duration
	// BatchSize bounds the sessions deleted per transaction.
	BatchSize int
	// ProbeBudget bounds the erased embeddings the residue probe queries per request.
	ProbeBudget int
	// RetryAfter is the wait after an unreachable database or a missing store.
	RetryAfter time.Duration
	// GraphBatch bounds the erased sessions one graph prune (and receipt) covers.
	GraphBatch int
	// GraphDeleteLimit bounds the graph elements one delete query removes.
	GraphDeleteLimit int
	// GraphTimeout bounds the graph work of one pass.
	GraphTimeout time.Duration
	// PlanTTL is how long a planning request (kubectl erasure plan) left
	// behind by its plugin stays after its plan (DefaultPlanTTL when zero).
	PlanTTL time.Duration
	// BackupRecheck bounds the wait between checks of Backups still expiring.
	BackupRecheck time.Duration
	// MaxConcurrentReconciles is how many requests are worked on at once
	// (each in its own transactions; the database guards make that safe).
	MaxConcurrentReconciles int
	// ReceiptKeySecret names the Secret with the receipt signing key; empty:
	// receipts are unsigned.
	ReceiptKeySecret types.NamespacedName

	// probes keeps the sampled embeddings between the delete and the residue
	// probe, in memory only, keyed by request UID.
	probes sync.Map
}

// scope is what one pass works on.
type scope struct {
	// crashed is set when a test's fault hook simulates a crash: the pass
	// ends at once and writes no status, as a killed manager would.
	crashed bool
	// gone: the pass deleted the request, so there is no status to write.
	gone   bool
	req    *lethev1.ErasureRequest
	before *lethev1.ErasureRequest
	store  *lethev1.MemoryStore
	eraser *postgres.Eraser
	result ctrl.Result
}

type step func(ctx context.Context, s *scope) (done bool, err error)

// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=erasurerequests,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=erasurerequests/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=erasurerequests/finalizers,verbs=update

// Reconcile runs the steps in order and writes the status once.
func (r *ErasureRequestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	log := ctrl.LoggerFrom(ctx)
	er := &lethev1.ErasureRequest{}
	if err := r.Client.Get(ctx, req.NamespacedName, er); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	// The finalizer goes on before anything touches the database.
	if er.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(er, Finalizer) {
		controllerutil.AddFinalizer(er, Finalizer)
		if err := patchFinalizers(ctx, r.Client, er); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: time.Second}, nil
			}
			return ctrl.Result{}, err
		}
	}

	s := &scope{req: er, before: er.DeepCopy()}
	if !er.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, s)
	}

	defer func() {
		if s.crashed || s.gone {
			return
		}
		if err := r.patchStatus(ctx, s); err != nil {
			if apierrors.IsConflict(err) {
				s.result = ctrl.Result{RequeueAfter: time.Second}
				return
			}
			retErr = err
		}
	}()

	r.initStatus(s)
	// Planned and Cancelled are final: nothing, not even an unreachable
	// database, may rewrite their conditions.
	res, reaped, err := r.reapPlan(ctx, er)
	if reaped || err != nil {
		s.gone = true
		return res, err
	}
	if terminal(s.req.Status.Conditions) {
		return res, nil
	}
	if done := r.resolveStore(ctx, s); !done {
		return s.result, nil
	}
	steps := []step{r.tombstone, r.grace, r.delete, r.graph, r.backups}
	for _, st := range steps {
		done, err := st(ctx, s)
		if s.crashed {
			return ctrl.Result{RequeueAfter: 50 * time.Millisecond}, nil
		}
		if err != nil {
			log.Error(err, "step failed", "phase", derivePhase(er.Status.Conditions, er.Spec.DryRun))
			return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
		}
		if !done {
			return s.result, nil
		}
	}
	if err := r.issueReceipt(ctx, s); err != nil {
		log.Error(err, "the receipt could not be issued")
		return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
	}
	// Completed: re-verify on an interval (restored backups, stale graph
	// writes). Only from the latest status: what a re-verification does
	// must land in the history, and a stale pass could not write it.
	if fresh, err := r.isFresh(ctx, er); err != nil || !fresh {
		return ctrl.Result{RequeueAfter: time.Second}, err
	}
	if err := r.reverify(ctx, s); err != nil {
		log.Error(err, "re-verification failed")
		return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
	}
	return ctrl.Result{RequeueAfter: r.ReverifyInterval}, nil
}

// patchFinalizers writes the object's metadata.finalizers and nothing else:
// a JSON merge patch guarded by the resourceVersion it was read at. An Update
// would re-send the whole object, re-serialised by Go (gracePeriod "168h"
// comes back as "168h0m0s"), and GitOps tools would report a drift the user
// never made. A stale resourceVersion gets a conflict, never a lost write.
func patchFinalizers(ctx context.Context, c client.Client, obj client.Object) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"finalizers":      obj.GetFinalizers(),
		"resourceVersion": obj.GetResourceVersion(),
	}})
	if err != nil {
		return err
	}
	return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
}

// isFresh reports whether er is the API server's latest version.
func (r *ErasureRequestReconciler) isFresh(ctx context.Context, er *lethev1.ErasureRequest) (bool, error) {
	latest := &lethev1.ErasureRequest{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(er), latest); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return latest.ResourceVersion == er.ResourceVersion, nil
}

// faultHook, set only by tests (export_test.go), simulates a crash at a
// named point of a step: when it returns true the pass stops there without
// writing status, and the in-memory probe sample is lost, as after a restart.
var faultHook atomic.Pointer[func(namespace, point string) bool]

// crashAt reports whether the fault hook crashed the pass at point.
func (r *ErasureRequestReconciler) crashAt(s *scope, point string) bool {
	hook := faultHook.Load()
	if hook == nil || !(*hook)(s.req.Namespace, point) {
		return false
	}
	s.crashed = true
	r.probes.Delete(s.req.UID)
	return true
}

// initStatus fills what is known from the spec alone.
func (r *ErasureRequestReconciler) initStatus(s *scope) {
	st := &s.req.Status
	st.Sessions = int32(len(s.req.Spec.SessionIDs))
	requested := s.req.CreationTimestamp.Time
	if s.req.Spec.RequestedAt != nil {
		requested = s.req.Spec.RequestedAt.Time
	}
	st.Deadline = mtime(deadline(requested))
}

// resolveStore finds the MemoryStore and opens its database.
func (r *ErasureRequestReconciler) resolveStore(ctx context.Context, s *scope) bool {
	store := &lethev1.MemoryStore{}
	key := types.NamespacedName{Namespace: s.req.Namespace, Name: s.req.Spec.StoreRef.Name}
	if err := r.Client.Get(ctx, key, store); err != nil {
		if apierrors.IsNotFound(err) && !meta.IsStatusConditionTrue(s.req.Status.Conditions, lethev1.ConditionTombstoned) {
			r.setStep(s, lethev1.ConditionTombstoned, false, lethev1.ReasonStoreNotFound,
				fmt.Sprintf("MemoryStore %q not found in namespace %s", key.Name, key.Namespace))
		}
		s.result = ctrl.Result{RequeueAfter: r.RetryAfter}
		return false
	}
	s.store = store
	dsn, f := readSecretKey(ctx, r.SecretReader, store.Namespace, store.Spec.Postgres.DSNSecretRef)
	if f == nil {
		pool, err := r.Pools.Get(ctx, poolKey(store, "primary"), dsn)
		if err == nil {
			s.eraser = &postgres.Eraser{Pool: pool, Schema: store.Spec.Postgres.Schema, TenantID: store.Spec.TenantID}
			return true
		}
		f = fail(lethev1.ReasonDatabaseUnavailable, "%v", err)
	}
	r.setStep(s, firstPending(s.req.Status.Conditions), false, lethev1.ReasonDatabaseUnavailable, "the memory database is unreachable: "+f.message)
	s.result = ctrl.Result{RequeueAfter: r.RetryAfter}
	return false
}

// setStep sets one step condition; its message must not change between passes.
func (r *ErasureRequestReconciler) setStep(s *scope, condType string, ok bool, reason, message string) {
	if condType == "none" {
		return
	}
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	// The transition time is the injected clock's, like every other time
	// the reconciler compares (the planning request's TTL counts from it).
	meta.SetStatusCondition(&s.req.Status.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message, ObservedGeneration: s.req.Generation,
		LastTransitionTime: metav1.NewTime(r.Clock.Now()),
	})
}

// milestone appends a history entry chained to the last one and emits an event.
func (r *ErasureRequestReconciler) milestone(s *scope, phase lethev1.Phase, event string, at time.Time, ev any, note string) {
	if h := s.req.Status.History; len(h) > 0 && event != lethev1.ReasonResurrected {
		metrics.StepDuration.WithLabelValues(string(phase)).Observe(max(0, at.Sub(h[len(h)-1].Time.Time).Seconds()))
	}
	d, err := evidence.Digest(ev)
	if err != nil {
		d = "sha256:unavailable"
	}
	s.req.Status.History = evidence.Append(s.req.Status.History, phase, event, at, d)
	reason := string(phase)
	if event != "" {
		reason = event
	}
	r.Recorder.Eventf(s.req, nil, corev1.EventTypeNormal, reason, "Erase", "%s", note)
}

// patchStatus derives phase, Ready, Stalled and Reconciling, then writes the status once if it changed.
func (r *ErasureRequestReconciler) patchStatus(ctx context.Context, s *scope) error {
	st := &s.req.Status
	st.Phase = derivePhase(st.Conditions, s.req.Spec.DryRun)
	ready, stalled := summary(st.Conditions, st.Phase, s.req.Generation)
	if st.Phase == lethev1.PhaseBackupsRotated && st.Receipt != nil && st.Receipt.Envelope == "" {
		ready.Message += "; the receipt is unsigned: no signing key is configured (--receipt-key-secret)"
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	meta.SetStatusCondition(&st.Conditions, stalled)
	meta.SetStatusCondition(&st.Conditions, reconciling(st.Conditions, ready, stalled, st.Phase, s.req.Generation))
	st.ObservedGeneration = s.req.Generation
	if equality.Semantic.DeepEqual(s.before.Status, s.req.Status) {
		return nil
	}
	// Optimistic: a pass that started from a stale cache must not
	// overwrite a newer status; it gets a conflict and runs again.
	return r.Client.Status().Patch(ctx, s.req, client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{}))
}

// request is the database's view of the erasure request.
func request(er *lethev1.ErasureRequest) postgres.Request {
	ids := make([]string, len(er.Spec.SessionIDs))
	for i, id := range er.Spec.SessionIDs {
		ids[i] = string(id)
	}
	grace := time.Duration(0)
	if !er.Spec.Immediate && er.Spec.GracePeriod != nil {
		grace = er.Spec.GracePeriod.Duration
	}
	return postgres.Request{UID: string(er.UID), SessionIDs: ids, Grace: grace}
}

// deletionPredicate lets the deletion of a request through the generation filter.
func deletionPredicate() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return !e.ObjectNew.GetDeletionTimestamp().IsZero() },
	}
}

func (r *ErasureRequestReconciler) takeProbe(uid types.UID) ([]pgvector.Vector, bool) {
	v, ok := r.probes.Load(uid)
	if !ok {
		return nil, false
	}
	return v.([]pgvector.Vector), true
}

// SetupWithManager registers the reconciler.
func (r *ErasureRequestReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.ReverifyInterval == 0 {
		r.ReverifyInterval = time.Hour
	}
	if r.BatchSize == 0 {
		r.BatchSize = 100
	}
	if r.ProbeBudget == 0 {
		r.ProbeBudget = 64
	}
	if r.RetryAfter == 0 {
		r.RetryAfter = 15 * time.Second
	}
	if r.GraphBatch == 0 {
		r.GraphBatch = 50
	}
	if r.GraphDeleteLimit == 0 {
		r.GraphDeleteLimit = 1000
	}
	if r.GraphTimeout == 0 {
		r.GraphTimeout = 5 * time.Minute
	}
	if r.BackupRecheck == 0 {
		r.BackupRecheck = 10 * time.Minute
	}
	if r.Rotator.Client == nil {
		r.Rotator.Client = r.Client
	}
	if r.Rotator.Reader == nil {
		r.Rotator.Reader = r.APIReader
	}
	if r.Rotator.Concurrency == 0 {
		r.Rotator.Concurrency = 8
	}
	if err := crmetrics.Registry.Register(NewRequestCollector(mgr.GetClient())); err != nil {
		if !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&lethev1.ErasureRequest{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{},
			deletionPredicate()))).
		Named("erasurerequest").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(1, r.MaxConcurrentReconciles)}).
		Complete(r)
}
