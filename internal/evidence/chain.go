// Package evidence builds and verifies the hash chain of an ErasureRequest's
// history. Each entry's digest covers the previous entry's digest, its phase,
// event, time (whole seconds, UTC: what the API stores) and the digest of the
// evidence recorded with it, so editing, dropping or reordering an entry
// breaks every digest after it.
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

// EntryDigest computes the digest an entry must carry.
func EntryDigest(e lethev1.HistoryEntry) string {
	h := sha256.New()
	for _, part := range []string{
		domain, e.PreviousDigest, string(e.Phase), e.Event,
		e.Time.UTC().Truncate(time.Second).Format(time.RFC3339), e.EvidenceDigest,
	} {
		_, _ = fmt.Fprintf(h, "%d:%s\n", len(part), part)
	}
	return digestPrefix + hex.EncodeToString(h.Sum(nil))
}

// Append returns history with a new entry chained to its last one.
func Append(history []lethev1.HistoryEntry, phase lethev1.Phase, event string, at time.Time, evidenceDigest string) []lethev1.HistoryEntry {
	e := lethev1.HistoryEntry{
		Phase:          phase,
		Event:          event,
		Time:           metav1.NewTime(at.UTC().Truncate(time.Second)),
		EvidenceDigest: evidenceDigest,
	}
	if n := len(history); n > 0 {
		e.PreviousDigest = history[n-1].Digest
	}
	e.Digest = EntryDigest(e)
	return append(history, e)
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

// Verify recomputes the chain. It returns a *VerifyError naming the first
// entry whose link or digest is wrong.
func Verify(history []lethev1.HistoryEntry) error {
	prev := ""
	for i, e := range history {
		if e.PreviousDigest != prev {
			return &VerifyError{Index: i, Reason: fmt.Sprintf("previousDigest %q does not match the digest of entry %d", e.PreviousDigest, i-1)}
		}
		if want := EntryDigest(e); e.Digest != want {
			return &VerifyError{Index: i, Reason: "digest does not match the entry's content (edited?)"}
		}
		prev = e.Digest
	}
	return nil
}
