package controllers

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// Finalizer lets Lethe act when a request is deleted: during the grace period
// the tombstones are lifted (and a Cancelled receipt written); after the
// deletion, removing the object undoes nothing and the receipts in the
// database remain.
const Finalizer = "erasure.lethe.dev/finalizer"

// Connector turns a MemoryStore into the ports of one pass
// (internal/connector implements it; tests decorate it).
type Connector interface {
	Ports(ctx context.Context, store *lethev1.MemoryStore) (erasure.Ports, error)
}

// ErasureRequestReconciler runs the erasure phase machine (internal/erasure)
// over one request per pass: it resolves the store and its ports, runs the
// steps in order until one is not done, applies each step's outcome in one
// place, and writes the status once.
type ErasureRequestReconciler struct {
	Client    client.Client
	APIReader client.Reader
	// SecretReader reads the receipt signing key's Secret, uncached.
	SecretReader client.Reader
	Recorder     events.EventRecorder
	Clock        clock.PassiveClock
	Connector    Connector
	// Records keeps each store's record of what was erased; nil: none kept.
	Records *ErasureRecords
	// finishing holds the UIDs of deleted requests finishing their steps
	// whose event was recorded (once per process).
	finishing sync.Map
	// mirrored holds, per request UID, the history length last mirrored
	// into the database by this process.
	mirrored sync.Map
	// witnesses holds, per store UID, the receipt log checkpoints its
	// requests hold that were found consistent with the log already
	// (*evidence.Witness).
	witnesses sync.Map
	// keys caches the signing key for keyTTL, and the published key set.
	keys keyCache
	// guarded holds, per request UID, the history length whose chain and
	// signatures the guard last verified.
	guarded sync.Map

	// ReverifyInterval is how often a completed request is checked for
	// resurrected sessions.
	ReverifyInterval time.Duration
	// BatchSize bounds the sessions deleted per transaction.
	BatchSize int
	// ProbeBudget bounds the erased embeddings the residue probe queries per request.
	ProbeBudget int
	// RetryAfter is the wait after a missing store or a configuration a human must fix.
	RetryAfter time.Duration
	// BackoffBase and BackoffMax bound controller-runtime's exponential
	// backoff after an error (an unreachable database, graph or API).
	BackoffBase, BackoffMax time.Duration
	// GraphBatch bounds the erased sessions one graph prune (and receipt) covers.
	GraphBatch int
	// GraphDeleteLimit bounds the graph elements one delete query removes.
	GraphDeleteLimit int
	// GraphTimeout bounds the graph work of one pass.
	GraphTimeout time.Duration
	// PlanTTL is how long a planning request (kubectl erasure plan) left
	// behind by its plugin stays after its plan (DefaultPlanTTL when zero).
	PlanTTL time.Duration
	// MinGracePeriod is the shortest grace period a request that is not
	// immediate may have (DefaultMinGracePeriod when zero).
	MinGracePeriod time.Duration
	// BackupRecheck bounds the wait between checks of Backups still expiring.
	BackupRecheck time.Duration
	// MaxConcurrentReconciles is how many requests are worked on at once
	// (each in its own transactions; the database guards make that safe).
	MaxConcurrentReconciles int
	// ReceiptKeySecret names the Secret with the receipt signing key; empty:
	// receipts are unsigned.
	ReceiptKeySecret types.NamespacedName
	// KeyCacheTTL is how long the signing key read from the Secret is
	// reused (default one minute): a replaced key signs from then on.
	KeyCacheTTL time.Duration
	// Withheld records the requests whose receipt-log inclusion was left
	// out, shared with the MemoryStore reconciler, which wakes them (a
	// private one when nil).
	Withheld *WithheldInclusions
	// Reverify, when set, brings requests to a pass at once (the MemoryStore
	// audit sends those whose erasures a restore took back).
	Reverify <-chan event.TypedGenericEvent[client.Object]
	// Velero, when set, is asked until Velero's CRDs are served; then the
	// controller watches Backups and DeleteBackupRequests (veleroWatch).
	Velero VeleroDetector
	// VeleroDiscoveryInterval is how often Velero is looked for until found
	// (DefaultVeleroDiscoveryInterval when zero).
	VeleroDiscoveryInterval time.Duration

	machine *erasure.Machine
	// wakes carries the requests whose step's outside work ended
	// (erasure_wake.go).
	wakes chan event.TypedGenericEvent[client.Object]
}

// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=erasurerequests,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=erasurerequests/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=erasure.lethe.dev,resources=erasurerequests/finalizers,verbs=update
// +kubebuilder:rbac:groups=velero.io,resources=backups,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=velero.io,resources=deletebackuprequests,verbs=get;list;watch;create

// Reconcile runs the steps in order and writes the status once. Whatever
// priority brought the pass (a wake's is WakePriority), the request is
// queued again at the default one: controller-runtime would otherwise keep
// the wake's priority for every later recheck of the request, and
// completed requests rechecking ahead of the queue would starve new ones.
func (r *ErasureRequestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	res.Priority = new(0)
	return res, err
}

func (r *ErasureRequestReconciler) reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	er := &lethev1.ErasureRequest{}
	if err := r.Client.Get(ctx, req.NamespacedName, er); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// Past the deletion, every pass re-verifies, and what it finds must land
	// in the history: the pass works on the whole, latest request, read
	// uncached (the cache keeps it without its evidence).
	if trimmedInCache(er) {
		latest := &lethev1.ErasureRequest{}
		if err := r.APIReader.Get(ctx, req.NamespacedName, latest); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		er = latest
	}
	// The finalizer goes on before anything touches the database.
	if er.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(er, Finalizer) {
		controllerutil.AddFinalizer(er, Finalizer)
		if err := patchFinalizers(ctx, r.Client, er); err != nil {
			return requeueOnConflict(err)
		}
	}
	if !er.DeletionTimestamp.IsZero() && !r.finishesFirst(ctx, er) {
		return r.finalize(ctx, er)
	}

	p, err := r.newPass(ctx, er)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer r.finishPass(ctx, p, &res, &retErr)
	initStatus(er)
	// Planned and Cancelled are final: nothing, not even an unreachable
	// database, may rewrite their conditions.
	res, reaped, err := r.reapPlan(ctx, er)
	if reaped || err != nil {
		p.gone = true
		return res, err
	}
	if erasure.Terminal(er) {
		return res, nil
	}
	if err := r.guard(er); err != nil {
		// Said once per pass; the request waits for a human.
		r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, ReasonEvidenceTampered, "Verify",
			"%s; Lethe signs nothing more for this request until it is restored", err.Error())
		return ctrl.Result{}, fmt.Errorf("the request's status was edited: %w", err)
	}
	if p.keyErr != nil {
		// Said on the step the request is on; nothing is signed or done.
		out := erasure.Outcome{Kind: erasure.Errored, Err: p.keyErr, Condition: stepCondition(erasure.FirstPending(er),
			lethev1.ReasonSigningKeyUnavailable, "the receipt signing key cannot be read (see the manager's --receipt-key-secret); every history entry is signed, so the request waits for it")}
		r.record(p, out)
		return r.result(ctx, "signing key", out)
	}
	return r.runSteps(ctx, p)
}

// runSteps runs the steps in order until one is not done, then completes
// the request and re-verifies it.
func (r *ErasureRequestReconciler) runSteps(ctx context.Context, p *pass) (ctrl.Result, error) {
	er := p.req
	sc, blocked := r.scope(ctx, p)
	if blocked != nil {
		r.record(p, *blocked)
		return r.result(ctx, "store", *blocked)
	}
	// soon is the earliest look again a done step asked for (a re-erasure
	// whose entry waits for the replicas): the later steps went on.
	var soon time.Duration
	for _, st := range r.machine.Steps() {
		out := st.Run(ctx, sc)
		r.record(p, out)
		if out.Wake != nil {
			r.wakeOn(ctx, out.Wake, er)
		}
		if !out.IsDone() {
			return r.result(ctx, st.Name(), out)
		}
		if out.RequeueAfter > 0 {
			soon = sooner(soon, out.RequeueAfter)
		}
	}
	mirrorFailed, err := r.completed(ctx, sc, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !er.DeletionTimestamp.IsZero() {
		// Finished while being deleted: the next pass releases the finalizer.
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	res, err := r.reverify(ctx, p, sc)
	if err != nil {
		return res, err
	}
	if !persisted(p) {
		// The receipt or an entry this pass added is mirrored once the API
		// server holds it: after this pass's status write (finishPass).
		p.mirror = sc
	}
	if mirrorFailed {
		soon = sooner(soon, mirrorRetry)
	}
	if soon > 0 && (res.RequeueAfter == 0 || res.RequeueAfter > soon) {
		res.RequeueAfter = soon
	}
	return res, nil
}

// sooner is the earlier of two requeues, 0 being none.
func sooner(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}

// mirrorRetry is how soon a pass whose mirror failed tries again.
const mirrorRetry = 10 * time.Second

// newPass starts a pass with the key that signs its history entries:
// without the key (configured but unreadable) the pass waits, as the
// receipt would; never an unsigned entry in a signed history.
func (r *ErasureRequestReconciler) newPass(ctx context.Context, er *lethev1.ErasureRequest) (*pass, error) {
	key, err := r.signingKey(ctx)
	if err != nil {
		return &pass{req: er, before: er.DeepCopy(), keyErr: fmt.Errorf("the receipt signing key signs every history entry: %w", err)}, nil
	}
	return &pass{req: er, before: er.DeepCopy(), key: key}, nil
}

// guard refuses to go on with a request whose status someone else edited
// where the manager would build on it: the manager signs only evidence it
// wrote, on a history it signed, and skips a step only when its signed
// milestone is there. It checks a v1 history (a legacy one is unkeyed).
func (r *ErasureRequestReconciler) guard(er *lethev1.ErasureRequest) error {
	if er.Status.EvidenceFormat == "" {
		return nil
	}
	if n, ok := r.guarded.Load(er.UID); !ok || n.(int) != len(er.Status.History) {
		c := evidence.ChainOf(er)
		if err := evidence.VerifyChain(c); err != nil {
			return err
		}
		if ks, ok := r.keys.published(); ok {
			if _, err := evidence.VerifySignatures(c, ks, false); err != nil {
				return err
			}
		}
		if err := evidence.CheckParts(er.Status.History); err != nil {
			return err
		}
		r.guarded.Store(er.UID, len(er.Status.History))
	}
	if un := erasure.UnbackedConditions(er); len(un) > 0 {
		return fmt.Errorf("condition(s) %v are True without their milestone in the history", un)
	}
	return evidence.Unchanged(er, erasure.FirstPending(er))
}

// completed issues the receipt of a request whose steps are all done and
// mirrors it, with the history, into the database. A mirror that fails (a
// database not yet migrated to 00012) is reported, and stops nothing: the
// re-verification that follows matters more, and the next pass mirrors.
func (r *ErasureRequestReconciler) completed(ctx context.Context, sc *erasure.Scope, p *pass) (mirrorFailed bool, err error) {
	er := p.req
	if err := r.issueReceipt(ctx, er); err != nil {
		return false, fmt.Errorf("issue the receipt: %w", err)
	}
	if !persisted(p) {
		// Only what the API server holds goes into the database: a pass
		// whose status write is lost would leave a history there that the
		// request's next one does not extend. The pass mirrors it once its
		// status write holds (finishPass); a request being deleted, before
		// its finalizer goes (finalize).
		return false, nil
	}
	if err := r.mirrorUnlessHeld(ctx, sc, er); err != nil {
		r.mirrorFailed(ctx, er, err)
		return true, nil
	}
	return false, nil
}

// mirrorFailed reports a mirror that failed; the next pass tries again.
func (r *ErasureRequestReconciler) mirrorFailed(ctx context.Context, er *lethev1.ErasureRequest, err error) {
	if errors.Is(err, evidence.ErrReceiptChanged) {
		ctrl.LoggerFrom(ctx).Error(err, "the proof is in the database, but its receipt in the store's receipt log was changed; no checkpoint is signed over it")
		r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, ReasonReceiptChanged, "Mirror",
			"the store's receipt log holds another receipt where this request's is: it was edited with the database owner's rights; "+
				"Lethe signs no checkpoint over it and checks again on the next pass")
		return
	}
	ctrl.LoggerFrom(ctx).Error(err, "the proof is not in the database yet; the next pass tries again")
	r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, ReasonProofNotMirrored, "Mirror",
		"the receipt and history could not be written to lethe.erasure_proofs (are Lethe's migrations applied?); retried on the next pass")
}

// persisted reports whether the pass's receipt and history are those the
// API server already holds (the pass read them, it did not add them).
func persisted(p *pass) bool {
	b := p.before.Status
	return b.Receipt != nil && p.req.Status.Receipt != nil && b.Receipt.Digest == p.req.Status.Receipt.Digest &&
		len(b.History) == len(p.req.Status.History)
}

// ReasonEvidenceTampered is the request's Warning when its evidence was
// edited after its history recorded it.
const ReasonEvidenceTampered = "EvidenceTampered"

// ReasonReceiptChanged is the request's Warning when its receipt in the
// store's receipt log was edited.
const ReasonReceiptChanged = "ReceiptChanged"

// ReasonProofNotMirrored is the request's event when its proof could not
// be written to the database.
const ReasonProofNotMirrored = "ProofNotMirrored"

// finishPass writes the pass's status once, unless the pass deleted the
// request. A conflict is a quick, silent retry, unless a step failed: its
// error still goes to controller-runtime.
func (r *ErasureRequestReconciler) finishPass(ctx context.Context, p *pass, res *ctrl.Result, retErr *error) {
	if p.gone {
		return
	}
	err := r.patchStatus(ctx, p)
	switch {
	case err == nil:
		for _, f := range p.written {
			f()
		}
		if p.mirror != nil && *retErr == nil {
			r.mirrorWritten(ctx, p, res, retErr)
		}
	case *retErr != nil:
		*retErr = errors.Join(*retErr, err)
	default:
		*res, *retErr = requeueOnConflict(err)
	}
}

// mirrorWritten mirrors the proof the pass's status write just put in the
// API server (p.req is what the server returned), and writes the log
// inclusion the mirror adds when the receipt is signed. A mirror or a
// write that fails is retried by a pass soon, as a mirror in a pass of its
// own would be.
func (r *ErasureRequestReconciler) mirrorWritten(ctx context.Context, p *pass, res *ctrl.Result, retErr *error) {
	p.before = p.req.DeepCopy()
	if err := r.mirrorProof(ctx, p.mirror, p.req); err != nil {
		r.mirrorFailed(ctx, p.req, err)
		res.RequeueAfter = sooner(res.RequeueAfter, mirrorRetry)
		return
	}
	if err := r.patchStatus(ctx, p); err != nil {
		*res, *retErr = requeueOnConflict(err)
	}
}

// reverify checks the graph and backups of a completed request again on an
// interval (stale graph writes, re-synced Backups), each with its step's own
// code, every check in every pass (a resurrection found by one never delays
// another). The deletion's check ran as its step.
func (r *ErasureRequestReconciler) reverify(ctx context.Context, p *pass, sc *erasure.Scope) (ctrl.Result, error) {
	next := r.ReverifyInterval
	for _, c := range r.machine.Reverifiers() {
		out := c.Reverify(ctx, sc)
		r.record(p, out)
		if out.Kind == erasure.Errored {
			return r.result(ctx, "re-verification", out)
		}
		if out.Kind == erasure.Waiting && out.RequeueAfter > 0 {
			next = min(next, out.RequeueAfter)
		}
	}
	return ctrl.Result{RequeueAfter: next}, nil
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

// requeueOnConflict turns a conflict (a stale read) into a quick, silent
// retry; any other error goes to controller-runtime.
func requeueOnConflict(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, err
}

// initStatus fills what is known from the spec alone.
func initStatus(er *lethev1.ErasureRequest) {
	st := &er.Status
	st.Sessions = int32(len(er.Spec.SessionIDs))
	requested := er.CreationTimestamp.Time
	if er.Spec.RequestedAt != nil {
		requested = er.Spec.RequestedAt.Time
	}
	st.Deadline = mtime(erasure.Deadline(requested))
}

// deletionPredicate lets the deletion of a request through the generation filter.
func deletionPredicate() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return !e.ObjectNew.GetDeletionTimestamp().IsZero() },
	}
}

// requestPredicates filter the controller's own watch of requests (all
// must pass): a change of spec or annotations, a deletion, and any new
// request but the done ones of the first list (doneAtStartHandler's).
func requestPredicates() []predicate.Predicate {
	return []predicate.Predicate{notDoneAtStart(), predicate.Or(
		predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, deletionPredicate())}
}

// SetupWithManager fills the defaults and registers the reconciler.
func (r *ErasureRequestReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.defaults()
	r.machine = erasure.NewMachine(erasure.Config{
		BatchSize: r.BatchSize, ProbeBudget: r.ProbeBudget, GraphBatch: r.GraphBatch, GraphDeleteLimit: r.GraphDeleteLimit,
		GraphTimeout: r.GraphTimeout, RetryAfter: r.RetryAfter, BackupRecheck: r.BackupRecheck,
		ReverifyInterval: r.ReverifyInterval, ReplicaRecheck: 2 * time.Second, MinGracePeriod: r.MinGracePeriod,
	})
	if err := crmetrics.Registry.Register(NewRequestCollector(mgr.GetClient())); err != nil {
		if !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&lethev1.ErasureRequest{}, builder.WithPredicates(requestPredicates()...)).
		Watches(&lethev1.ErasureRequest{}, doneAtStartHandler())
	if r.Reverify != nil {
		b = b.WatchesRawSource(source.Channel(r.Reverify, &handler.TypedEnqueueRequestForObject[client.Object]{}))
	}
	r.wakes = make(chan event.TypedGenericEvent[client.Object])
	b = b.WatchesRawSource(source.Channel(r.wakes, wakeHandler()))
	c, err := b.Named("erasurerequest").
		WithOptions(controller.Options{
			MaxConcurrentReconciles: max(1, r.MaxConcurrentReconciles),
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](r.BackoffBase, r.BackoffMax),
		}).
		Build(r)
	if err != nil || r.Velero == nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &lethev1.ErasureRequest{}, indexWaitingOnBackups, waitingOnBackups); err != nil {
		return err
	}
	return mgr.Add(&veleroWatch{detector: r.Velero, ctrl: c, cache: mgr.GetCache(), reader: mgr.GetClient(),
		interval: cmp.Or(r.VeleroDiscoveryInterval, DefaultVeleroDiscoveryInterval)})
}

func (r *ErasureRequestReconciler) defaults() {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Withheld == nil {
		r.Withheld = &WithheldInclusions{}
	}
	setDefault(&r.ReverifyInterval, time.Hour)
	setDefault(&r.BatchSize, 100)
	setDefault(&r.ProbeBudget, 64)
	setDefault(&r.RetryAfter, 15*time.Second)
	setDefault(&r.BackoffBase, time.Second)
	setDefault(&r.BackoffMax, 5*time.Minute)
	setDefault(&r.GraphBatch, 50)
	setDefault(&r.GraphDeleteLimit, 1000)
	setDefault(&r.GraphTimeout, 5*time.Minute)
	setDefault(&r.BackupRecheck, 10*time.Minute)
	setDefault(&r.MinGracePeriod, lethev1.DefaultMinGracePeriod)
}

func setDefault[T int | time.Duration](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}
