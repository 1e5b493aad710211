package controllers

import (
	"context"
	"encoding/json"
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

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// Where the receipt keys live.
const (
	// ReceiptPrivateKey is the Secret key holding the PEM ed25519 private key.
	ReceiptPrivateKey = "private-key.pem"
	// ReceiptPublicKey is the ConfigMap key (ConfigMap named like the
	// Secret, in its namespace) where the manager publishes the public key
	// for `kubectl erasure verify`.
	ReceiptPublicKey = "public-key.pem"
	// ReceiptKeySet is the ConfigMap key of the key set (evidence.KeySet
	// JSON): every key that signed, with when it was current.
	ReceiptKeySet = "keyset.json"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update

// issueReceipt makes the receipt of a completed request over the history
// head, signed when a key is configured. A configured key that cannot be
// read is an error (retried): Lethe never falls back to an unsigned receipt.
func (r *ErasureRequestReconciler) issueReceipt(ctx context.Context, er *lethev1.ErasureRequest) error {
	if er.Status.Receipt != nil {
		return nil
	}
	key, err := r.signingKey(ctx)
	if err != nil {
		return err
	}
	rc, err := evidence.Issue(ctx, er, key, r.Clock.Now())
	if err != nil {
		return err
	}
	er.Status.Receipt = rc
	// The completed request's one event: what it did, and its receipt.
	done := fmt.Sprintf("erasure complete after %d history entries (kubectl erasure history shows them)", len(er.Status.History))
	if key == nil {
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "ReceiptUnsigned", "Receipt", "%s; receipt issued over %s, unsigned: no signing key is configured", done, rc.Digest)
	} else {
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "ReceiptSigned", "Receipt", "%s; receipt over %s signed with key %s", done, rc.Digest, rc.KeyID)
	}
	return nil
}

// mirrorProof writes the completed request's receipt, history and
// evidence document into its store's database (through lethe.record_proof,
// which checks the chain and appends the proof to the store's receipt log),
// so that the proof outlives the request object; then it signs the log's
// new checkpoint and records the receipt's inclusion proof in the status.
// The receipt there is anonymous (signed over the same history, naming the
// request by UID only): the database is outside the request's namespace,
// and a name like forget-john-smith must not leave it. It is written once
// per history length in this process.
func (r *ErasureRequestReconciler) mirrorProof(ctx context.Context, sc *erasure.Scope, er *lethev1.ErasureRequest) error {
	if er.Status.Receipt == nil {
		return nil
	}
	key, err := r.signingKey(ctx)
	if err != nil {
		return err
	}
	// Mirrored already by this process, and, when signed, its inclusion
	// in the status covers the whole history: a pass whose status write
	// was lost left it out or left an older one, and the next one records
	// it again.
	if n, ok := r.mirrored.Load(er.UID); ok && n.(int) == len(er.Status.History) && (key == nil || logCoversHistoryIn(er, sc.Store) || r.stillWithheld(ctx, sc.Store, er)) {
		return nil
	}
	anon := er.DeepCopy()
	anon.Name, anon.Namespace = "", ""
	rc, err := evidence.Issue(ctx, anon, key, r.Clock.Now())
	if err != nil {
		return err
	}
	p := proofOf(er, sc.Store)
	p.Digest, p.Envelope, p.KeyID, p.IssuedAt = rc.Digest, rc.Envelope, rc.KeyID, rc.IssuedAt.Time
	idx, err := sc.Ledger.MirrorProof(ctx, p)
	if err != nil {
		return fmt.Errorf("mirror the proof into the database: %w", err)
	}
	if key != nil && idx >= 0 {
		switch err := r.logInclusion(ctx, sc, er, idx, key); {
		case errors.Is(err, receiptlog.ErrInconsistent):
			r.inclusionWithheld(ctx, sc.Store, er, err)
		case err != nil:
			return err
		default:
			r.Withheld.forget(er.UID)
		}
	}
	r.mirrored.Store(er.UID, len(er.Status.History))
	return nil
}

// inclusionWithheld records that the proof is in the database but its
// store's receipt log does not extend the checkpoints the store's requests
// hold (a restore took receipts back, or someone removed or reordered
// them): Lethe signs no checkpoint of that log, so the receipt gets no
// inclusion for now. That is the store's standing state (its
// ReceiptLogConsistent condition), not a failed mirror: the request is not
// retried, nor held from release, for it. The request's event says it once
// per history length while this process runs; the store's audit wakes it
// once the log is consistent again.
func (r *ErasureRequestReconciler) inclusionWithheld(ctx context.Context, store *lethev1.MemoryStore, er *lethev1.ErasureRequest, cause error) {
	if !r.Withheld.withhold(store.UID, er.UID, client.ObjectKeyFromObject(er), len(er.Status.History)) {
		return
	}
	ctrl.LoggerFrom(ctx).Info("the proof is mirrored; the store's receipt log does not extend the checkpoints its requests hold, so its inclusion is left out",
		"cause", cause.Error())
	r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, ReasonReceiptLogInconsistent, "Log",
		"the proof is in the database, but the store's receipt log does not extend the checkpoints its requests hold (a restore?): "+
			"Lethe signs no checkpoint of it, so this receipt's log inclusion is left out until the store's audit finds the log consistent again")
}

// stillWithheld reports whether this request's inclusion was withheld for
// its whole history and its store's audit still finds the log not
// extending the held checkpoints: trying again would find the same. The
// audit wakes the requests it withheld once its status says the log
// extends them again (MemoryStoreReconciler.wakeUnlogged); the store is
// read from the API server then, since the woken pass may come before the
// cache has that status.
func (r *ErasureRequestReconciler) stillWithheld(ctx context.Context, store *lethev1.MemoryStore, er *lethev1.ErasureRequest) bool {
	n, ok := r.Withheld.length(er.UID)
	if !ok || n != len(er.Status.History) || store == nil || !logForked(store) {
		return false
	}
	fresh := &lethev1.MemoryStore{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(store), fresh); err != nil {
		return false
	}
	return fresh.UID == store.UID && logForked(fresh)
}

// logForked reports whether the store's audit found its receipt log not
// extending a checkpoint its requests hold.
func logForked(store *lethev1.MemoryStore) bool {
	c := meta.FindStatusCondition(store.Status.Conditions, lethev1.MemoryStoreReceiptLogConsistent)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == lethev1.ReasonReceiptLogInconsistent
}

// mirrorUnlessHeld mirrors the proof of a request whose status the API
// server already holds, unless the database holds it as it is
// (mirroredBefore). The completing pass's own, new proof goes straight to
// mirrorProof.
func (r *ErasureRequestReconciler) mirrorUnlessHeld(ctx context.Context, sc *erasure.Scope, er *lethev1.ErasureRequest) error {
	if r.mirroredBefore(ctx, sc, er) {
		return nil
	}
	return r.mirrorProof(ctx, sc, er)
}

// mirroredBefore reports whether the database holds the request's proof
// as it is. Each pass of a completed request asks it (one query), even
// when this process mirrored the proof: a restore of the database may
// have taken it back since, and writing every proof again instead would
// re-verify its chain in lethe.record_proof and, when signed, read the
// whole receipt log and sign a checkpoint (after a restart, for every
// request at once). The proof counts as held when the database has this
// history and evidence and, when signed, the leaf the status's inclusion
// names (the inclusion covering the whole history, in this store's log),
// or, while its inclusion is withheld and the store's audit finds the log
// forked, that leaf at any index. Leaves of another store's log (its
// store deleted and created again) do not count. A proof the
// database lost or holds otherwise is written again by mirrorProof. An
// error counts as not held: mirrorProof then decides, and reports what
// fails.
func (r *ErasureRequestReconciler) mirroredBefore(ctx context.Context, sc *erasure.Scope, er *lethev1.ErasureRequest) bool {
	if er.Status.Receipt == nil {
		return false
	}
	key, err := r.signingKey(ctx)
	if err != nil {
		return false
	}
	index := int64(-1)
	withheld, _ := r.Withheld.length(er.UID)
	switch {
	case withheld == len(er.Status.History) && logForked(sc.Store):
	case logCoversHistoryIn(er, sc.Store):
		index = er.Status.Receipt.Log.Index
	case key != nil:
		return false // the status needs its inclusion: mirrorProof writes it
	}
	held, err := sc.Ledger.ProofMirrored(ctx, proofOf(er, sc.Store), index)
	if err == nil && !held && index >= 0 {
		// Held elsewhere in the log (a restore moved the leaf): no loss,
		// but the inclusion is stale and mirrorProof writes a new one.
		if moved, err := sc.Ledger.ProofMirrored(ctx, proofOf(er, sc.Store), -1); err == nil && moved {
			r.mirrored.Delete(er.UID)
			return false
		}
	}
	switch {
	case err != nil:
		return false
	case !held:
		if n, ok := r.mirrored.LoadAndDelete(er.UID); ok && n.(int) == len(er.Status.History) {
			r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, ReasonProofLost, "Mirror",
				"the database no longer holds the proof this manager wrote, or holds it otherwise (a restore, or an edit with the database owner's rights): "+
					"what is missing is written again; a changed receipt is reported as ReceiptChanged")
		}
		return false
	}
	r.mirrored.Store(er.UID, len(er.Status.History))
	return true
}

// logOrigin is the origin of the store's receipt log ("" without a store).
func logOrigin(store *lethev1.MemoryStore) string {
	if store == nil {
		return ""
	}
	return receiptlog.Origin(string(store.UID))
}

// ReasonProofLost is the request's Warning when the database lost the proof
// this process had mirrored.
const ReasonProofLost = "ProofLost"

// proofOf is what ProofMirrored compares of the request's proof: its
// history, evidence format and the evidence document mirrored with it, and
// the log of its store.
func proofOf(er *lethev1.ErasureRequest, store *lethev1.MemoryStore) erasure.Proof {
	return erasure.Proof{UID: string(er.UID), History: er.Status.History, Format: er.Status.EvidenceFormat, Document: evidence.MirroredOf(er),
		Log: logOrigin(store)}
}

// logCoversHistoryIn is logCoversHistory for an inclusion in the log of
// store: one in the log of a store since deleted and created again under
// its name is of no use to it.
func logCoversHistoryIn(er *lethev1.ErasureRequest, store *lethev1.MemoryStore) bool {
	if !logCoversHistory(er) {
		return false
	}
	return receiptlog.NoteOrigin(er.Status.Receipt.Log.Checkpoint) == logOrigin(store)
}

// logCoversHistory reports whether the status holds the receipt's
// inclusion in the store's log for the whole history: after a re-erasure
// appends an entry, the inclusion written before it covers one entry less.
func logCoversHistory(er *lethev1.ErasureRequest) bool {
	l := er.Status.Receipt.Log
	return l != nil && int(l.HistoryLength) == len(er.Status.History)
}

// logInclusion signs the store's receipt log checkpoint at its current
// size, records it, and puts the receipt's inclusion proof in the status.
func (r *ErasureRequestReconciler) logInclusion(ctx context.Context, sc *erasure.Scope, er *lethev1.ErasureRequest, idx int64, key *evidence.Key) error {
	// The held checkpoints first: each was signed over a log read before
	// it was written to its request, so before this read of the log; read
	// the other way round, a pass completing meanwhile would hold a larger
	// checkpoint than this pass's log and look like removed receipts.
	held, err := heldCheckpoints(ctx, r.Client, sc.Store)
	if err != nil {
		return err
	}
	origin := receiptlog.Origin(string(sc.Store.UID))
	leaves, err := sc.Ledger.ReceiptLog(ctx, origin)
	if err != nil {
		return err
	}
	n := len(er.Status.History)
	ks, _ := r.keys.published()
	w, _ := r.witnesses.LoadOrStore(sc.Store.UID, &evidence.Witness{})
	incl, err := evidence.Include(leaves, idx, string(er.UID), evidence.Head(er.Status.History), n, origin, key, ks, held, w.(*evidence.Witness))
	if err != nil {
		return err
	}
	if err := sc.Ledger.WriteCheckpoint(ctx, origin, int64(len(leaves)), incl.Checkpoint); err != nil {
		return err
	}
	er.Status.Receipt.Log = incl
	return nil
}

// ReasonReceiptLogInconsistent: the store's receipt log lost or changed
// receipts that a checkpoint held by one of its requests covers.
const ReasonReceiptLogInconsistent = lethev1.ReasonReceiptLogInconsistent

// heldCheckpoints are the receipt log checkpoints the store's requests
// carry (the cluster's copy, out of the database's reach). The list is
// read from the cache without copying it (thousands of requests per
// completion); nothing in it is changed.
func heldCheckpoints(ctx context.Context, c client.Reader, store *lethev1.MemoryStore) ([][]byte, error) {
	list := &lethev1.ErasureRequestList{}
	if err := c.List(ctx, list, client.InNamespace(store.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var held [][]byte
	for _, o := range list.Items {
		if o.Spec.StoreRef.Name == store.Name && o.Status.Receipt != nil && o.Status.Receipt.Log != nil {
			held = append(held, []byte(o.Status.Receipt.Log.Checkpoint))
		}
	}
	return held, nil
}

// keyTTL is how long a pass reuses the signing key it read: a replaced
// key is picked up within it (evidence.RetirementSkew allows for it).
const keyTTL = time.Minute

// keyTTL is the configured KeyCacheTTL, keyTTL when unset.
func (r *ErasureRequestReconciler) keyTTL() time.Duration {
	if r.KeyCacheTTL > 0 {
		return r.KeyCacheTTL
	}
	return keyTTL
}

// keyCache holds the signing key last read and the key set published with it.
type keyCache struct {
	mu    sync.Mutex
	key   *evidence.Key
	set   evidence.KeySet
	until time.Time
}

// published is the key set last published, ok when there is one.
func (k *keyCache) published() (evidence.KeySet, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.set, len(k.set.Keys) > 0
}

// signingKey is the receipt signing key, nil when none is configured.
func (r *ErasureRequestReconciler) signingKey(ctx context.Context) (*evidence.Key, error) {
	if r.ReceiptKeySecret.Name == "" {
		return nil, nil
	}
	r.keys.mu.Lock()
	defer r.keys.mu.Unlock()
	// Wall time, not the injected clock: this is freshness, not evidence.
	if r.keys.key != nil && time.Now().Before(r.keys.until) {
		return r.keys.key, nil
	}
	key, err := r.receiptKey(ctx)
	if err != nil {
		return nil, err
	}
	r.keys.key, r.keys.until = key, time.Now().Add(r.keyTTL())
	return key, nil
}

// receiptKey reads the signing key from its Secret and publishes its
// public key in the key set of the ConfigMap of the same name.
func (r *ErasureRequestReconciler) receiptKey(ctx context.Context) (*evidence.Key, error) {
	ref := lethev1.SecretKeyRef{Name: r.ReceiptKeySecret.Name, Key: ReceiptPrivateKey}
	pemKey, err := (&connector.Connector{Secrets: r.SecretReader}).ReadSecretKey(ctx, r.ReceiptKeySecret.Namespace, ref)
	if err != nil {
		return nil, fmt.Errorf("receipt signing key %s: %w", r.ReceiptKeySecret, err)
	}
	key, err := evidence.ParsePrivateKey([]byte(pemKey))
	if err != nil {
		return nil, err
	}
	return key, r.publishKey(ctx, key)
}

// publishKey makes key the current key of the published key set (retiring
// the one before it, never removing it) and its public key the ConfigMap's
// public-key.pem.
func (r *ErasureRequestReconciler) publishKey(ctx context.Context, key *evidence.Key) error {
	pub, err := key.PublicKeyPEM()
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{}
	nn := types.NamespacedName{Namespace: r.ReceiptKeySecret.Namespace, Name: r.ReceiptKeySecret.Name}
	found := true
	switch err := r.APIReader.Get(ctx, nn, cm); {
	case apierrors.IsNotFound(err):
		found = false
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "lethe"}}}
	case err != nil:
		return err
	}
	ks, err := keySetOf(cm)
	if err != nil {
		return fmt.Errorf("the published key set in ConfigMap %s: %w", nn, err)
	}
	ks, changed, err := ks.WithCurrent(key, r.Clock.Now())
	if err != nil {
		return err
	}
	r.keys.set = ks
	if !changed && found && cm.Data[ReceiptPublicKey] == string(pub) {
		return nil
	}
	raw, err := json.MarshalIndent(ks, "", "  ")
	if err != nil {
		return err
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[ReceiptPublicKey], cm.Data["key-id"], cm.Data[ReceiptKeySet] = string(pub), key.ID(), string(raw)
	if !found {
		if err := r.Client.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("publish the receipt public key: %w", err)
		}
		return nil
	}
	if err := r.Client.Update(ctx, cm); err != nil {
		return fmt.Errorf("publish the receipt public key: %w", err)
	}
	return nil
}

// keySetOf reads the ConfigMap's key set. A ConfigMap published before key
// sets existed holds only public-key.pem: that key is taken as current
// since the epoch (it signed what came before the key set).
func keySetOf(cm *corev1.ConfigMap) (evidence.KeySet, error) {
	if raw, ok := cm.Data[ReceiptKeySet]; ok {
		return evidence.ParseKeySet([]byte(raw))
	}
	old, ok := cm.Data[ReceiptPublicKey]
	if !ok {
		return evidence.KeySet{}, nil
	}
	k, err := evidence.ParsePublicKey([]byte(old))
	if err != nil {
		return evidence.KeySet{}, err
	}
	return evidence.KeySet{Keys: []evidence.PublishedKey{{KeyID: k.ID(), PublicKey: old, ValidFrom: time.Unix(0, 0).UTC()}}}, nil
}
