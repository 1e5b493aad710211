// Package evidence builds and verifies the proof of an ErasureRequest: the
// hash chain of its history (each entry signed by the manager's key), the
// signed receipt over the chain's head, the key set that outlives key
// rotations, and the bundle that carries all of it to an auditor with no
// cluster. The format is documented in docs/evidence-format.md; Format
// names it.
package evidence

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

const (
	digestPrefix = "sha256:"
	// domain separates history digests from any other sha256 use.
	domain = "lethe.history.v1"
)

// Digest returns "sha256:<hex>" of v's JSON encoding. Struct fields encode in
// declaration order and map keys sorted, so the same value always gives the
// same digest.
func Digest(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode evidence: %w", err)
	}
	sum := sha256.Sum256(b)
	return digestPrefix + hex.EncodeToString(sum[:]), nil
}

// LegacyEntryDigest is the digest of an entry of a history written before
// the evidence format was versioned (status.evidenceFormat empty): length-
// prefixed fields, no key, no request binding.
func LegacyEntryDigest(e lethev1.HistoryEntry) string {
	h := sha256.New()
	for _, part := range []string{
		domain, e.PreviousDigest, string(e.Phase), e.Event,
		e.Time.UTC().Truncate(time.Second).Format(time.RFC3339), e.EvidenceDigest,
	} {
		_, _ = fmt.Fprintf(h, "%d:%s\n", len(part), part)
	}
	return digestPrefix + hex.EncodeToString(h.Sum(nil))
}

// Chain is a request's history with what its digests depend on: the
// request's UID and the evidence format.
type Chain struct {
	Format  string
	Request string
	History []lethev1.HistoryEntry
}

// ChainOf is the chain in er's status.
func ChainOf(er *lethev1.ErasureRequest) Chain {
	return Chain{Format: er.Status.EvidenceFormat, Request: string(er.UID), History: er.Status.History}
}

// entryDigest is the digest entry e must carry in this chain.
func (c Chain) entryDigest(e lethev1.HistoryEntry) string {
	if c.Format == "" {
		return LegacyEntryDigest(e)
	}
	return EntryDigestV1(c.Request, e)
}

// Append adds an entry chained to the last one, signed by key when key is
// not nil (a legacy chain is never signed: its digest would not cover the
// key).
func (c *Chain) Append(phase lethev1.Phase, event string, at time.Time, evidenceDigest string, key *Key) {
	c.AppendEntry(lethev1.HistoryEntry{Phase: phase, Event: event, Time: metav1.NewTime(at), EvidenceDigest: evidenceDigest}, key)
}

// AppendEntry adds e (its phase, event, time, evidence digest and parts)
// chained to the last entry: it fills the links, the key ID, the digest and
// the signature.
func (c *Chain) AppendEntry(e lethev1.HistoryEntry, key *Key) {
	e.Time = metav1.NewTime(e.Time.UTC().Truncate(time.Second))
	e.PreviousDigest, e.KeyID, e.Signature = "", "", ""
	if n := len(c.History); n > 0 {
		e.PreviousDigest = c.History[n-1].Digest
	}
	if key != nil && c.Format != "" {
		e.KeyID = key.ID()
	}
	e.Digest = c.entryDigest(e)
	if e.KeyID != "" {
		e.Signature = key.signDigest(e.Digest)
	}
	c.History = append(c.History, e)
}

// Append returns history with a new legacy (unkeyed) entry chained to its last one.
func Append(history []lethev1.HistoryEntry, phase lethev1.Phase, event string, at time.Time, evidenceDigest string) []lethev1.HistoryEntry {
	c := Chain{History: history}
	c.Append(phase, event, at, evidenceDigest, nil)
	return c.History
}

// Head returns the digest of the last entry, or "" for an empty history.
func Head(history []lethev1.HistoryEntry) string {
	if len(history) == 0 {
		return ""
	}
	return history[len(history)-1].Digest
}

// VerifyError names the first entry that does not verify.
type VerifyError struct {
	Index  int
	Reason string
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("history entry %d does not verify: %s", e.Index, e.Reason)
}

// Verify recomputes a legacy chain (see VerifyChain).
func Verify(history []lethev1.HistoryEntry) error {
	return VerifyChain(Chain{History: history})
}

// VerifyChain recomputes the chain's links and digests. It returns a
// *VerifyError naming the first entry whose link or digest is wrong.
// Signatures are checked by VerifySignatures.
func VerifyChain(c Chain) error {
	if c.Format != "" && c.Format != Format {
		return &VerifyError{Index: 0, Reason: fmt.Sprintf("evidence format %q is not one this version reads (%s)", c.Format, Format)}
	}
	prev := ""
	for i, e := range c.History {
		if e.PreviousDigest != prev {
			return &VerifyError{Index: i, Reason: fmt.Sprintf("previousDigest %q does not match the digest of entry %d", e.PreviousDigest, i-1)}
		}
		if want := c.entryDigest(e); e.Digest != want {
			return &VerifyError{Index: i, Reason: "digest does not match the entry's content (edited?)"}
		}
		prev = e.Digest
	}
	return nil
}
