package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/connector"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// Where the receipt keys live.
const (
	// ReceiptPrivateKey is the Secret key holding the PEM ed25519 private key.
	ReceiptPrivateKey = "private-key.pem"
	// ReceiptPublicKey is the ConfigMap key (ConfigMap named like the
	// Secret, in its namespace) where the manager publishes the public key
	// for `kubectl erasure verify`.
	ReceiptPublicKey = "public-key.pem"
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
	if key == nil {
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "ReceiptUnsigned", "Receipt", "receipt issued over %s, unsigned: no signing key is configured", rc.Digest)
	} else {
		r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "ReceiptSigned", "Receipt", "receipt over %s signed with key %s", rc.Digest, rc.KeyID)
	}
	return nil
}

// mirrorProof writes the completed request's receipt and history into its
// store's database, so that the proof outlives the request object. The
// receipt there is anonymous (signed over the same history, naming the
// request by UID only): the database is outside the request's namespace,
// and a name like forget-john-smith must not leave it. It is written once
// per history length in this process.
func (r *ErasureRequestReconciler) mirrorProof(ctx context.Context, sc *erasure.Scope, er *lethev1.ErasureRequest) error {
	if er.Status.Receipt == nil {
		return nil
	}
	if n, ok := r.mirrored.Load(er.UID); ok && n.(int) == len(er.Status.History) {
		return nil
	}
	key, err := r.signingKey(ctx)
	if err != nil {
		return err
	}
	anon := er.DeepCopy()
	anon.Name, anon.Namespace = "", ""
	rc, err := evidence.Issue(ctx, anon, key, r.Clock.Now())
	if err != nil {
		return err
	}
	p := erasure.Proof{UID: string(er.UID), Digest: rc.Digest, Envelope: rc.Envelope, KeyID: rc.KeyID, History: er.Status.History, IssuedAt: rc.IssuedAt.Time}
	if err := sc.Ledger.MirrorProof(ctx, p); err != nil {
		return fmt.Errorf("mirror the proof into the database: %w", err)
	}
	r.mirrored.Store(er.UID, len(er.Status.History))
	return nil
}

// signingKey is the receipt signing key, nil when none is configured.
func (r *ErasureRequestReconciler) signingKey(ctx context.Context) (*evidence.Key, error) {
	if r.ReceiptKeySecret.Name == "" {
		return nil, nil
	}
	return r.receiptKey(ctx)
}

// receiptKey reads the signing key from its Secret and publishes the public
// key in a ConfigMap of the same name.
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
	pub, err := key.PublicKeyPEM()
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{}
	nn := types.NamespacedName{Namespace: r.ReceiptKeySecret.Namespace, Name: r.ReceiptKeySecret.Name}
	switch err := r.APIReader.Get(ctx, nn, cm); {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "lethe"}},
			Data: map[string]string{ReceiptPublicKey: string(pub), "key-id": key.ID()}}
		if err := r.Client.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("publish the receipt public key: %w", err)
		}
	case err != nil:
		return nil, err
	case cm.Data[ReceiptPublicKey] != string(pub):
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[ReceiptPublicKey], cm.Data["key-id"] = string(pub), key.ID()
		if err := r.Client.Update(ctx, cm); err != nil {
			return nil, fmt.Errorf("publish the receipt public key: %w", err)
		}
	}
	return key, nil
}
