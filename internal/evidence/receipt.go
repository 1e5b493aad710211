package evidence

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	ita1 "github.com/in-toto/attestation/go/v1"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/signerverifier"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A receipt is a DSSE envelope around an in-toto statement whose subject is
// the request and whose digest is the history's head when it completed.
const (
	PayloadType   = "application/vnd.in-toto+json"
	PredicateType = "https://lethe.dev/erasure-receipt/v1"
)

// Key signs receipts with ed25519 (and verifies them).
type Key struct {
	sv  *signerverifier.ED25519SignerVerifier
	pub ed25519.PublicKey
	id  string
}

// GeneratePrivateKeyPEM makes a new ed25519 key in the PEM form
// ParsePrivateKey reads (what `openssl genpkey -algorithm ed25519` writes).
func GeneratePrivateKeyPEM() ([]byte, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKey reads a PEM "PRIVATE KEY" (PKCS #8) ed25519 key, as
// `openssl genpkey -algorithm ed25519` writes it.
func ParsePrivateKey(pemBytes []byte) (*Key, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("the receipt signing key is not a PEM PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse the receipt signing key: %w", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the receipt signing key is %T, want ed25519", k)
	}
	return newKey(priv.Public().(ed25519.PublicKey), priv)
}

// ParsePublicKey reads a PEM "PUBLIC KEY" (PKIX) ed25519 key.
func ParsePublicKey(pemBytes []byte) (*Key, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("the receipt public key is not a PEM PUBLIC KEY block")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse the receipt public key: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("the receipt public key is %T, want ed25519", k)
	}
	return newKey(pub, nil)
}

func newKey(pub ed25519.PublicKey, priv ed25519.PrivateKey) (*Key, error) {
	id, err := dsse.SHA256KeyID(pub)
	if err != nil {
		return nil, err
	}
	ssl := &signerverifier.SSLibKey{KeyType: "ed25519", Scheme: "ed25519", KeyID: id,
		KeyVal: signerverifier.KeyVal{Public: hex.EncodeToString(pub)}}
	if priv != nil {
		ssl.KeyVal.Private = hex.EncodeToString(priv)
	}
	sv, err := signerverifier.NewED25519SignerVerifierFromSSLibKey(ssl)
	if err != nil {
		return nil, err
	}
	return &Key{sv: sv, pub: pub, id: id}, nil
}

// ID is the key's ID (sha256 of its public key).
func (k *Key) ID() string { return k.id }

// PublicKeyPEM is the public key as PEM, for publishing.
func (k *Key) PublicKeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(k.pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// statement is the in-toto statement a receipt signs: the request, the
// history head and length, and the counts of every step. No content, no
// session IDs.
func statement(er *lethev1.ErasureRequest, head string, length int) (*ita1.Statement, error) {
	hexDigest, ok := strings.CutPrefix(head, "sha256:")
	if !ok {
		return nil, fmt.Errorf("history head %q is not a sha256 digest", head)
	}
	steps := []any{}
	if er.Status.Evidence != nil {
		for _, st := range er.Status.Evidence.Steps {
			counts := map[string]any{}
			for _, c := range st.Counts {
				counts[c.Table] = float64(c.Rows)
			}
			steps = append(steps, map[string]any{"step": st.Step, "counts": counts})
		}
	}
	request, subject := map[string]any{"namespace": er.Namespace, "name": er.Name, "uid": string(er.UID)},
		"erasurerequest/"+er.Namespace+"/"+er.Name+"/"+string(er.UID)
	if er.Name == "" {
		// Anonymous: the receipt mirrored outside the request's namespace
		// names the request by UID only.
		request, subject = map[string]any{"uid": string(er.UID)}, "erasurerequest/"+string(er.UID)
	}
	pred, err := structpb.NewStruct(map[string]any{
		"request":       request,
		"store":         er.Spec.StoreRef.Name,
		"phase":         string(er.Status.Phase),
		"sessions":      float64(len(er.Spec.SessionIDs)),
		"historyHead":   head,
		"historyLength": float64(length),
		"steps":         steps,
	})
	if err != nil {
		return nil, err
	}
	return &ita1.Statement{
		Type: ita1.StatementTypeUri,
		Subject: []*ita1.ResourceDescriptor{{
			Name:   subject,
			Digest: map[string]string{"sha256": hexDigest},
		}},
		PredicateType: PredicateType,
		Predicate:     pred,
	}, nil
}

// Issue makes the receipt of a completed request over its current history
// head: signed when key is not nil, unsigned (digest only) otherwise. A
// request without a name (a copy with its name and namespace cleared) gets
// an anonymous receipt, naming it by UID only.
func Issue(ctx context.Context, er *lethev1.ErasureRequest, key *Key, now time.Time) (*lethev1.Receipt, error) {
	head := Head(er.Status.History)
	r := &lethev1.Receipt{Digest: head, IssuedAt: &metav1.Time{Time: now}}
	if key == nil {
		return r, nil
	}
	st, err := statement(er, head, len(er.Status.History))
	if err != nil {
		return nil, err
	}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("receipt statement: %w", err)
	}
	payload, err := protojson.Marshal(st)
	if err != nil {
		return nil, err
	}
	signer, err := dsse.NewEnvelopeSigner(key.sv)
	if err != nil {
		return nil, err
	}
	env, err := signer.SignPayload(ctx, PayloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("sign the receipt: %w", err)
	}
	raw, err := json.Marshal(env)
	if err != nil {
		return nil, err
	}
	r.Envelope, r.KeyID = string(raw), key.ID()
	return r, nil
}

// VerifyReceipt checks a request's evidence as an auditor would: the history
// chain recomputes, the receipt's digest is an entry of it, and — when key
// is given — the envelope is signed by that key and its statement names this
// request and that digest. An unsigned receipt fails when a key is given.
func VerifyReceipt(ctx context.Context, er *lethev1.ErasureRequest, key *Key) error {
	if err := Verify(er.Status.History); err != nil {
		return err
	}
	r := er.Status.Receipt
	if r == nil {
		return errors.New("the request has no receipt (it has not completed)")
	}
	at := -1
	for i, h := range er.Status.History {
		if h.Digest == r.Digest {
			at = i
		}
	}
	if at < 0 {
		return fmt.Errorf("the receipt covers digest %s, which no history entry has", r.Digest)
	}
	if key == nil {
		return nil
	}
	if r.Envelope == "" {
		return errors.New("the receipt is unsigned")
	}
	env := &dsse.Envelope{}
	if err := json.Unmarshal([]byte(r.Envelope), env); err != nil {
		return fmt.Errorf("the receipt envelope is not DSSE JSON: %w", err)
	}
	if env.PayloadType != PayloadType {
		return fmt.Errorf("the receipt envelope's payload type is %q, want %q", env.PayloadType, PayloadType)
	}
	verifier, err := dsse.NewEnvelopeVerifier(key.sv)
	if err != nil {
		return err
	}
	if _, err := verifier.Verify(ctx, env); err != nil {
		return fmt.Errorf("the receipt signature does not verify with key %s: %w", key.ID(), err)
	}
	payload, err := env.DecodeB64Payload()
	if err != nil {
		return err
	}
	st := &ita1.Statement{}
	if err := protojson.Unmarshal(payload, st); err != nil {
		return fmt.Errorf("the receipt payload is not an in-toto statement: %w", err)
	}
	want := strings.TrimPrefix(r.Digest, "sha256:")
	if len(st.Subject) != 1 || st.Subject[0].Digest["sha256"] != want || !strings.HasSuffix(st.Subject[0].Name, "/"+string(er.UID)) {
		return fmt.Errorf("the signed statement does not name this request and digest %s", r.Digest)
	}
	return nil
}
