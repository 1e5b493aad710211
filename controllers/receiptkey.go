package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/internal/evidence"
)

// Event reasons of the receipt key setup (on the Secret).
const (
	ReasonReceiptKeyCreated = "ReceiptKeyCreated"
	ReasonReceiptKeyInvalid = "ReceiptKeyInvalid"
)

// ReceiptKeySetup makes sure the receipt signing key exists so that receipts
// are signed from the first install: when the configured Secret does not
// exist (and Create is set) it generates an ed25519 key, stores it, and says
// so in an Event on the Secret and a log line. It never overwrites a Secret
// that exists, even one it cannot use. It then publishes the public key in
// the ConfigMap of the same name, as the receipt step does.
type ReceiptKeySetup struct {
	// Client writes the Secret and the ConfigMap.
	Client client.Client
	// Reader reads them straight from the API server (Secrets are never cached).
	Reader client.Reader
	// Recorder records the Event on a created (or unusable) Secret.
	Recorder events.EventRecorder
	// Secret is the configured --receipt-key-secret.
	Secret types.NamespacedName
	// Create generates the Secret when it does not exist (--receipt-key-create).
	Create bool

	warned bool
	// created holds the Secret this process created until its public key
	// is published: only then is the creation announced.
	created *corev1.Secret
}

// errKeyMissing: the Secret does not exist and creating it is turned off.
var errKeyMissing = errors.New("does not exist and --receipt-key-create=false: create it (PEM ed25519 under " + ReceiptPrivateKey + ") or receipts wait for it")

// Ensure makes sure the Secret exists and holds a usable key, publishes the
// public key, and returns the key's ID and whether this process created the
// Secret (reported once, by the call that published its public key). It is safe to repeat and to run in several managers at once: the
// Secret is created only if absent, and the loser of a race reuses the
// winner's key.
func (s *ReceiptKeySetup) Ensure(ctx context.Context) (keyID string, created bool, err error) {
	secret := &corev1.Secret{}
	switch err := s.Reader.Get(ctx, s.Secret, secret); {
	case apierrors.IsNotFound(err) && s.Create:
		if s.created, err = s.create(ctx); err != nil {
			return "", false, err
		}
	case apierrors.IsNotFound(err):
		return "", false, fmt.Errorf("receipt signing key Secret %s %w", s.Secret, errKeyMissing)
	case err != nil:
		return "", false, fmt.Errorf("read the receipt signing key Secret %s: %w", s.Secret, err)
	}
	// The receipt step's own path: read the key, publish the public key.
	r := &ErasureRequestReconciler{Client: s.Client, APIReader: s.Reader, SecretReader: s.Reader, ReceiptKeySecret: s.Secret, Clock: clock.RealClock{}}
	key, err := r.receiptKey(ctx)
	if err != nil {
		if s.created == nil && !s.warned && secret.Name != "" {
			// Said once per process: the Secret is the user's to fix, never overwritten.
			s.warned = true
			s.Recorder.Eventf(secret, nil, corev1.EventTypeWarning, ReasonReceiptKeyInvalid, "ReceiptKeySetup",
				"the Secret holds no usable receipt signing key (want PEM ed25519 under %s); receipts wait until it does", ReceiptPrivateKey)
		}
		return "", false, err
	}
	if s.created != nil {
		// Logged once the public key is published: whoever reads this can verify.
		ctrl.LoggerFrom(ctx).WithName("receipt-key").Info("created the receipt signing key: receipts are signed with it", "secret", s.Secret.String(), "keyID", key.ID())
		s.created, created = nil, true
	}
	return key.ID(), created, nil
}

// create stores a new key in the Secret unless another manager got there
// first (then its key is used: it returns nil).
func (s *ReceiptKeySetup) create(ctx context.Context) (*corev1.Secret, error) {
	pemKey, err := evidence.GeneratePrivateKeyPEM()
	if err != nil {
		return nil, err
	}
	immutable := true
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Secret.Namespace, Name: s.Secret.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "lethe", "app.kubernetes.io/managed-by": "lethe-manager"}},
		Type: corev1.SecretTypeOpaque,
		// Immutable: a signing key is replaced by deleting the Secret, never edited in place.
		Immutable: &immutable,
		Data:      map[string][]byte{ReceiptPrivateKey: pemKey},
	}
	switch err := s.Client.Create(ctx, secret); {
	case apierrors.IsAlreadyExists(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("create the receipt signing key Secret %s: %w", s.Secret, err)
	}
	// The Event goes out with the Secret (the recorder sends it in the
	// background, and a manager stopped right after the log line below
	// must not lose it); the public key is published next.
	if key, err := evidence.ParsePrivateKey(pemKey); err == nil {
		s.Recorder.Eventf(secret, nil, corev1.EventTypeNormal, ReasonReceiptKeyCreated, "ReceiptKeySetup",
			"no receipt signing key existed: created an ed25519 key (ID %s); its public key is published in the ConfigMap %s", key.ID(), s.Secret.Name)
	}
	return secret, nil
}

// Start runs Ensure until it succeeds or ctx ends (a manager Runnable): an
// API server not yet reachable, RBAC granted late or a Secret fixed by hand
// is picked up without a restart. Meanwhile the receipt step waits for the
// key (it never falls back to an unsigned receipt).
func (s *ReceiptKeySetup) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("receipt-key").WithValues("secret", s.Secret.String())
	for delay := time.Second; ; delay = min(2*delay, time.Minute) {
		id, created, err := s.Ensure(ctx)
		if err == nil {
			if !created {
				log.Info("receipts are signed with the existing key", "keyID", id)
			}
			return nil
		}
		log.Error(err, "receipt signing key not ready; retrying", "after", delay.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// NeedLeaderElection is false: every replica may make sure the key exists
// (creation is atomic), so a standby has it too.
func (s *ReceiptKeySetup) NeedLeaderElection() bool { return false }
