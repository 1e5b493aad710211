package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get

// receiptLogFacts is what an audit found of the store's receipt log.
type receiptLogFacts struct {
	// configured: receipts are signed (a key set is published).
	configured bool
	// held is how many checkpoints the store's requests hold; checked how
	// many of them a published key opens for this store's log (the rest
	// could not be held against it).
	held, checked int
	// inconsistent is set when the log does not extend one of them.
	inconsistent error
	// err is set when the check could not run.
	err error
}

// errNoKeySet: the ConfigMap the receipt keys are published in is absent.
var errNoKeySet = errors.New("no key set published yet")

// checkReceiptLog checks the store's receipt log against every checkpoint
// its requests hold, once per audit: a completion checks it before it
// signs, but a log changed or shortened (a restore, an edit with the
// owner's rights) between completions would otherwise go unseen until the
// next one. One read of the log per store (also when no request holds a
// checkpoint: a leaf missing from its middle would otherwise go unseen
// while every completion leaves its inclusion out); the store's Witness
// spares the signature checks of the checkpoints it already checked
// against a log this one extends.
func (r *MemoryStoreReconciler) checkReceiptLog(ctx context.Context, store *lethev1.MemoryStore) receiptLogFacts {
	if r.ReceiptKeySet.Name == "" {
		return receiptLogFacts{}
	}
	f := receiptLogFacts{configured: true}
	held, err := heldCheckpoints(ctx, r.Client, store)
	if err != nil {
		f.err = err
		return f
	}
	f.held = len(held)
	ledger, err := r.Connector.Ledger(ctx, store)
	if err != nil {
		f.err = err
		return f
	}
	origin := receiptlog.Origin(string(store.UID))
	leaves, err := ledger.ReceiptLog(ctx, origin)
	if errors.Is(err, receiptlog.ErrInconsistent) {
		f.inconsistent = err // a leaf removed from its middle
		return f
	}
	if err != nil || f.held == 0 {
		f.err = err
		return f
	}
	w, _ := r.logWitnesses.LoadOrStore(types.NamespacedName{Namespace: store.Namespace, Name: store.Name}, &evidence.Witness{})
	for _, fresh := range []bool{false, true} {
		ks, err := r.keySet(ctx, fresh)
		if err != nil {
			f.err = err
			return f
		}
		f.checked, f.inconsistent = evidence.CheckLog(leaves, origin, ks, held, w.(*evidence.Witness))
		// A checkpoint no cached key opens may be a key published since:
		// read the key set once more before calling it unverified.
		if f.inconsistent != nil || f.checked == f.held {
			break
		}
	}
	return f
}

// publishedKeys caches the published receipt key set for keyTTL: keys are
// only ever added to it, and a checkpoint signed by a key not yet seen is
// skipped, not refused, until the next read.
type publishedKeys struct {
	mu    sync.Mutex
	set   evidence.KeySet
	until time.Time
}

// keySet is the receipt key set published in the ConfigMap ReceiptKeySet,
// read again when fresh or when the cached one is older than keyTTL.
func (r *MemoryStoreReconciler) keySet(ctx context.Context, fresh bool) (evidence.KeySet, error) {
	r.keys.mu.Lock()
	defer r.keys.mu.Unlock()
	// Wall time, not the injected clock: this is freshness, not evidence.
	if !fresh && time.Now().Before(r.keys.until) {
		return r.keys.set, nil
	}
	cm := &corev1.ConfigMap{}
	if err := r.APIReader.Get(ctx, r.ReceiptKeySet, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return evidence.KeySet{}, fmt.Errorf("receipt key set ConfigMap %s: %w", r.ReceiptKeySet, errNoKeySet)
		}
		return evidence.KeySet{}, err
	}
	ks, err := keySetOf(cm)
	if err != nil {
		return evidence.KeySet{}, fmt.Errorf("the published key set in ConfigMap %s: %w", r.ReceiptKeySet, err)
	}
	r.keys.set, r.keys.until = ks, time.Now().Add(keyTTL)
	return ks, nil
}

// reportReceiptLog records a Warning on the store when its receipt log
// turns inconsistent (once per change, as the condition does), with what
// failed: sizes and the log's name, which the condition leaves out (they
// change from one audit to the next).
func (r *MemoryStoreReconciler) reportReceiptLog(ctx context.Context, store *lethev1.MemoryStore, f receiptLogFacts, wasConsistent bool) {
	if f.inconsistent == nil {
		return
	}
	if wasConsistent {
		r.Recorder.Eventf(store, nil, corev1.EventTypeWarning, lethev1.ReasonReceiptLogInconsistent, "Audit",
			"the store's receipt log does not extend a checkpoint its requests hold (receipts removed or changed: a restore?); Lethe signs no checkpoint of it: %v", f.inconsistent)
	}
	ctrl.LoggerFrom(ctx).Info("the store's receipt log does not extend a checkpoint its requests hold", "cause", f.inconsistent.Error())
}

// wakeUnlogged brings to a pass, at each audit whose status says the
// store's receipt log extends every held checkpoint, each of its requests
// whose inclusion a pass left out meanwhile (Withheld): they sign it now.
// Each audit, not only the one that turned the condition True: a pass may
// record its request after that audit took the others. Never blocks: a
// full queue keeps the rest for the next audit.
func (r *MemoryStoreReconciler) wakeUnlogged(store *lethev1.MemoryStore) {
	if r.Reverify == nil || !meta.IsStatusConditionTrue(store.Status.Conditions, lethev1.MemoryStoreReceiptLogConsistent) {
		return
	}
	for _, w := range r.Withheld.take(store.UID) {
		er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: w.key.Namespace, Name: w.key.Name}}
		select {
		case r.Reverify <- event.TypedGenericEvent[client.Object]{Object: er}:
		default:
			r.Withheld.putBack(store.UID, w)
		}
	}
}

// receiptLogCondition is ReceiptLogConsistent. Its messages hold no count
// that changes from one audit to the next.
func receiptLogCondition(f storeFacts, cond func(string, bool, string, string) metav1.Condition) metav1.Condition {
	l := f.receiptLog
	unknown := func(reason, msg string) metav1.Condition {
		return asUnknown(cond(lethev1.MemoryStoreReceiptLogConsistent, false, reason, msg))
	}
	switch {
	case !l.configured:
		return cond(lethev1.MemoryStoreReceiptLogConsistent, true, lethev1.ReasonNotConfigured,
			"no receipt signing key is configured: no checkpoint of the receipt log is signed")
	case f.postgres != nil:
		return unknown(lethev1.ReasonPostgresNotReady, "the receipt log cannot be checked until Postgres is reachable")
	case l.err != nil:
		return unknown(lethev1.ReasonReceiptLogCheckFailed, "the receipt log check could not run; it is retried on the next audit")
	case l.inconsistent != nil:
		return cond(lethev1.MemoryStoreReceiptLogConsistent, false, lethev1.ReasonReceiptLogInconsistent,
			"the receipt log does not extend a checkpoint the store's requests hold: receipts it covers were removed or changed (a restore?); the Warning event says which sizes")
	case l.held == 0:
		return cond(lethev1.MemoryStoreReceiptLogConsistent, true, lethev1.ReasonNoCheckpointsHeld,
			"no request of the store holds a checkpoint of its receipt log yet")
	case l.checked < l.held:
		return unknown(lethev1.ReasonCheckpointsUnverified,
			"a checkpoint the store's requests hold opens with no published key for this store's log (a store recreated under its name, a key removed from the key set, an edited status): it cannot be held against the log")
	default:
		return cond(lethev1.MemoryStoreReceiptLogConsistent, true, lethev1.ReasonLogExtendsCheckpoints,
			"the receipt log extends every checkpoint the store's requests hold")
	}
}
