package evidence

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// RetirementSkew is how long after a key's retirement an entry it signed is
// still accepted: a manager reads its key at most this often, so a pass in
// flight when the key was replaced may still sign with the old one.
const RetirementSkew = 5 * time.Minute

// PublishedKey is one public key of the key set: its ID, PEM, and when it
// signed (from validFrom until validUntil; no validUntil: the current key).
type PublishedKey struct {
	KeyID      string     `json:"keyID"`
	PublicKey  string     `json:"publicKey"`
	ValidFrom  time.Time  `json:"validFrom"`
	ValidUntil *time.Time `json:"validUntil,omitempty"`
}

// KeySet is every key the manager has signed with, oldest first. Keys are
// never removed from it: rotation retires a key (validUntil), so old
// receipts keep verifying.
type KeySet struct {
	Keys []PublishedKey `json:"keys"`
}

// ParseKeySet reads a key set's JSON.
func ParseKeySet(b []byte) (KeySet, error) {
	var ks KeySet
	if err := json.Unmarshal(b, &ks); err != nil {
		return ks, fmt.Errorf("the key set is not JSON: %w", err)
	}
	for _, k := range ks.Keys {
		pub, err := ParsePublicKey([]byte(k.PublicKey))
		if err != nil {
			return ks, fmt.Errorf("key %s of the key set: %w", k.KeyID, err)
		}
		if pub.ID() != k.KeyID {
			return ks, fmt.Errorf("key %s of the key set: its public key has ID %s", k.KeyID, pub.ID())
		}
	}
	return ks, nil
}

// WithCurrent returns the set with key as its current key: unchanged when
// it already is; otherwise the current key is retired at now and key added
// (or, if it was retired before, made current again from now).
func (ks KeySet) WithCurrent(key *Key, now time.Time) (KeySet, bool, error) {
	out := KeySet{Keys: append([]PublishedKey(nil), ks.Keys...)}
	for _, k := range out.Keys {
		if k.KeyID == key.ID() && k.ValidUntil == nil {
			return ks, false, nil
		}
	}
	pemBytes, err := key.PublicKeyPEM()
	if err != nil {
		return ks, false, err
	}
	now = now.UTC().Truncate(time.Second)
	for i := range out.Keys {
		if out.Keys[i].ValidUntil == nil {
			out.Keys[i].ValidUntil = &now
		}
	}
	out.Keys = append(out.Keys, PublishedKey{KeyID: key.ID(), PublicKey: string(pemBytes), ValidFrom: now})
	return out, true, nil
}

// Lookup returns the published keys with this ID (one per period it was current).
func (ks KeySet) Lookup(id string) []PublishedKey {
	var out []PublishedKey
	for _, k := range ks.Keys {
		if k.KeyID == id {
			out = append(out, k)
		}
	}
	return out
}

// ErrUnknownKey: the key set has no key of that ID.
var ErrUnknownKey = errors.New("not in the key set")

// CheckSignedAt verifies sig over msg by the key id, made at time at: the
// key must be in the set and not retired by then (a retired key's
// signature dated after its retirement, beyond RetirementSkew, is refused:
// the key may have leaked). The time is the signer's claim: what stops a
// leaked key from back-dating is the receipt log. It returns the published
// key that verified.
func (ks KeySet) CheckSignedAt(id string, msg, sig []byte, at time.Time) (PublishedKey, error) {
	periods := ks.Lookup(id)
	if len(periods) == 0 {
		return PublishedKey{}, fmt.Errorf("key %s is %w", shortID(id), ErrUnknownKey)
	}
	pub, err := ParsePublicKey([]byte(periods[0].PublicKey))
	if err != nil {
		return PublishedKey{}, err
	}
	if !ed25519.Verify(pub.pub, msg, sig) {
		return PublishedKey{}, fmt.Errorf("the signature does not verify with key %s", shortID(id))
	}
	return ks.currentAt(id, at)
}

// currentAt returns the period in which key id was current at time at.
func (ks KeySet) currentAt(id string, at time.Time) (PublishedKey, error) {
	periods := ks.Lookup(id)
	for _, p := range periods {
		// Only retirement binds: validFrom is the manager's clock and entry
		// times are the database's, and a key signing "before" it was
		// published forges nothing the current key could not.
		if p.ValidUntil == nil || !at.After(p.ValidUntil.Add(RetirementSkew)) {
			return p, nil
		}
	}
	if len(periods) == 0 {
		return PublishedKey{}, fmt.Errorf("key %s is %w", shortID(id), ErrUnknownKey)
	}
	return periods[0], fmt.Errorf("key %s signed at %s, outside the period it was current (%s)", shortID(id), at.UTC().Format(time.RFC3339), periods[0].validity())
}

func (p PublishedKey) validity() string {
	if p.ValidUntil == nil {
		return "from " + p.ValidFrom.UTC().Format(time.RFC3339) + ", still current"
	}
	return "from " + p.ValidFrom.UTC().Format(time.RFC3339) + " until " + p.ValidUntil.UTC().Format(time.RFC3339)
}

// Validity says when the key was current, for a verifier's report.
func (p PublishedKey) Validity() string { return p.validity() }

// signDigest signs an entry's digest: base64 of the ed25519 signature of SignedMessage(digest).
func (k *Key) signDigest(digest string) string {
	return base64.StdEncoding.EncodeToString(ed25519.Sign(k.priv, SignedMessage(digest)))
}

// VerifySignatures checks every entry's signature against the key set, at
// the entry's time. An unsigned entry fails unless allowUnsigned (a
// history written with no key configured, or a legacy chain); a signed
// entry after an unsigned one in a v1 chain fails always. It returns the
// keys that signed, in order of first use.
func VerifySignatures(c Chain, ks KeySet, allowUnsigned bool) ([]PublishedKey, error) {
	var used []PublishedKey
	seen := map[string]bool{}
	for i, e := range c.History {
		if e.Signature == "" || e.KeyID == "" {
			if !allowUnsigned {
				return used, &VerifyError{Index: i, Reason: "the entry is unsigned: anyone allowed to write the request's status could have written it"}
			}
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(e.Signature)
		if err != nil {
			return used, &VerifyError{Index: i, Reason: "the signature is not base64"}
		}
		k, err := ks.CheckSignedAt(e.KeyID, SignedMessage(e.Digest), sig, e.Time.Time)
		if err != nil {
			return used, &VerifyError{Index: i, Reason: err.Error()}
		}
		if !seen[k.KeyID] {
			seen[k.KeyID] = true
			used = append(used, k)
		}
	}
	return used, nil
}

// shortID is a key ID's first 19 characters (the SHA256: prefix and 12
// of the fingerprint), for messages.
func shortID(id string) string {
	if len(id) > 19 {
		return id[:19]
	}
	return id
}

// publicKeys are the set's ed25519 public keys.
func (ks KeySet) publicKeys() ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for _, k := range ks.Keys {
		pub, err := ParsePublicKey([]byte(k.PublicKey))
		if err != nil {
			return nil, err
		}
		out = append(out, pub.pub)
	}
	return out, nil
}
