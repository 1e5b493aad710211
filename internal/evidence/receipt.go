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
	sv   *signerverifier.ED25519SignerVerifier
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
	id   string
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

// GenerateKey makes a new signing key (what GeneratePrivateKeyPEM writes, parsed).
func GenerateKey() (*Key, error) {
	pemKey, err := GeneratePrivateKeyPEM()
	if err != nil {
		return nil, err
	}
	return ParsePrivateKey(pemKey)
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
	return &Key{sv: sv, pub: pub, priv: priv, id: id}, nil
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

// statement is the in-toto statement a receipt signs (predicate: the
// documented receiptPredicate). No content, no session IDs.
func statement(er *lethev1.ErasureRequest, head string, length int, issuedAt time.Time) (*ita1.Statement, error) {
	hexDigest, ok := strings.CutPrefix(head, "sha256:")
	if !ok {
		return nil, fmt.Errorf("history head %q is not a sha256 digest", head)
	}
	subject := "erasurerequest/" + er.Namespace + "/" + er.Name + "/" + string(er.UID)
	if er.Name == "" {
		// Anonymous: the receipt mirrored outside the request's namespace
		// names the request by UID only.
		subject = "erasurerequest/" + string(er.UID)
	}
	pred, err := predicateOf(er, length, issuedAt)
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
	now = now.UTC().Truncate(time.Second)
	r := &lethev1.Receipt{Digest: head, IssuedAt: &metav1.Time{Time: now}}
	if key == nil {
		return r, nil
	}
	st, err := statement(er, head, len(er.Status.History), now)
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

// openReceipt checks the receipt's DSSE envelope against the key set (the
// key current when it was issued) and returns its statement.
func openReceipt(ctx context.Context, r *lethev1.Receipt, ks KeySet) (*ita1.Statement, PublishedKey, error) {
	env := &dsse.Envelope{}
	if err := json.Unmarshal([]byte(r.Envelope), env); err != nil {
		return nil, PublishedKey{}, fmt.Errorf("the receipt envelope is not DSSE JSON: %w", err)
	}
	if env.PayloadType != PayloadType {
		return nil, PublishedKey{}, fmt.Errorf("the receipt envelope's payload type is %q, want %q", env.PayloadType, PayloadType)
	}
	periods := ks.Lookup(r.KeyID)
	if len(periods) == 0 {
		return nil, PublishedKey{}, fmt.Errorf("the receipt is signed by key %s, which is %w", shortID(r.KeyID), ErrUnknownKey)
	}
	key, err := ParsePublicKey([]byte(periods[0].PublicKey))
	if err != nil {
		return nil, PublishedKey{}, err
	}
	verifier, err := dsse.NewEnvelopeVerifier(key.sv)
	if err != nil {
		return nil, PublishedKey{}, err
	}
	if _, err := verifier.Verify(ctx, env); err != nil {
		return nil, PublishedKey{}, fmt.Errorf("the receipt signature does not verify with key %s: %w", shortID(key.ID()), err)
	}
	payload, err := env.DecodeB64Payload()
	if err != nil {
		return nil, periods[0], err
	}
	st := &ita1.Statement{}
	if err := protojson.Unmarshal(payload, st); err != nil {
		return nil, periods[0], fmt.Errorf("the receipt payload is not an in-toto statement: %w", err)
	}
	return st, periods[0], nil
}
