package evidence

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gowebpki/jcs"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Format is the evidence format of requests whose history starts under it:
// every digest is sha256 over RFC 8785 (JCS) canonical JSON of a documented
// object (docs/evidence-format.md), so an auditor's own script can
// recompute it. A request whose status.evidenceFormat is empty has the
// legacy chain (LegacyEntryDigest): verifiable, but unkeyed.
const Format = "lethe.dev/evidence/v1"

// Canonical returns the RFC 8785 canonical JSON of v's JSON encoding.
func Canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode evidence: %w", err)
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("canonicalize evidence: %w", err)
	}
	return out, nil
}

// CanonicalDigest returns "sha256:<hex>" of v's canonical JSON.
func CanonicalDigest(v any) (string, error) {
	b, err := Canonical(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return digestPrefix + hex.EncodeToString(sum[:]), nil
}

// Document is what a history entry's evidenceDigest covers: the request
// (UID, store, a digest of the session IDs asked for) and the digest of
// each part of its evidence as it stood when the entry was written
// (evidence parts: "plan" and one per step, see PartsOf). The entry carries
// the parts itself, so every entry's evidenceDigest recomputes.
type Document struct {
	Format   string            `json:"format"`
	Request  string            `json:"request"`
	Store    string            `json:"store"`
	Sessions string            `json:"sessions"`
	Parts    map[string]string `json:"parts"`
}

// SessionsDigest is D(spec.sessionIDs): the session IDs asked for, as a digest.
func SessionsDigest(ids []lethev1.SessionID) string {
	if ids == nil {
		ids = []lethev1.SessionID{}
	}
	d, err := CanonicalDigest(ids)
	if err != nil {
		panic(err) // strings: cannot fail
	}
	return d
}

// DocumentFor is the evidence document of request er with these parts;
// sessions overrides the digest of er's session IDs when not empty (a
// proof read back from the database holds the digest, not the IDs).
func DocumentFor(er *lethev1.ErasureRequest, parts map[string]string, sessions string) Document {
	if sessions == "" {
		sessions = SessionsDigest(er.Spec.SessionIDs)
	}
	if parts == nil {
		parts = map[string]string{}
	}
	return Document{Format: Format, Request: string(er.UID), Store: er.Spec.StoreRef.Name, Sessions: sessions, Parts: parts}
}

// entryDocument is what a v1 entry's digest covers: every field of the
// entry but the digest and the signature, the request's UID (a chain copied
// onto another request does not verify) and the format.
type entryDocument struct {
	Format         string `json:"format"`
	Request        string `json:"request"`
	PreviousDigest string `json:"previousDigest"`
	Phase          string `json:"phase"`
	Event          string `json:"event"`
	Time           string `json:"time"`
	EvidenceDigest string `json:"evidenceDigest"`
	KeyID          string `json:"keyID"`
}

// EntryDigestV1 is the digest a v1 entry of request uid must carry.
func EntryDigestV1(uid string, e lethev1.HistoryEntry) string {
	d, err := CanonicalDigest(entryDocument{
		Format: Format, Request: uid, PreviousDigest: e.PreviousDigest, Phase: string(e.Phase), Event: e.Event,
		Time: e.Time.UTC().Truncate(time.Second).Format(time.RFC3339), EvidenceDigest: e.EvidenceDigest, KeyID: e.KeyID,
	})
	if err != nil {
		// Strings only: the encoding cannot fail.
		panic(err)
	}
	return d
}

// SignedMessage is what an entry's signature signs: its digest, under a
// prefix that no receipt (DSSE) or checkpoint (signed note) message starts with.
func SignedMessage(digest string) []byte {
	return []byte(Format + "/history-entry\n" + digest)
}
