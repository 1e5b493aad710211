package evidence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gowebpki/jcs"
	k8stypes "k8s.io/apimachinery/pkg/types"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// BundleFormat names the bundle's own layout.
const BundleFormat = "lethe.dev/evidence-bundle/v1"

// Bundle is a request's proof in one self-contained file: the request
// (spec, status with plan, evidence, history, receipt and its log
// inclusion), the key set that signed it, and the formats. Verifying it
// needs no cluster.
type Bundle struct {
	Format         string                  `json:"format"`
	EvidenceFormat string                  `json:"evidenceFormat"`
	ExportedAt     time.Time               `json:"exportedAt"`
	ExportedBy     string                  `json:"exportedBy"`
	Request        *lethev1.ErasureRequest `json:"request"`
	KeySet         KeySet                  `json:"keySet"`
}

// NewBundle packs er and the key set. Server-side bookkeeping that is not
// evidence (managed fields, last-applied annotations) is left out.
func NewBundle(er *lethev1.ErasureRequest, ks KeySet, exportedBy string, now time.Time) *Bundle {
	req := er.DeepCopy()
	req.ManagedFields = nil
	req.Annotations = nil
	req.APIVersion, req.Kind = lethev1.GroupVersion.String(), "ErasureRequest"
	return &Bundle{Format: BundleFormat, EvidenceFormat: er.Status.EvidenceFormat, ExportedAt: now.UTC().Truncate(time.Second),
		ExportedBy: exportedBy, Request: req, KeySet: ks}
}

// ReadBundle parses a bundle file. It accepts only a bundle that reads the
// same to any JSON tool as to this one: no duplicate keys, no field it
// does not know, no key spelled in another case, no explicit empty value
// where the format omits it (each would let what Lethe verifies differ
// from what an auditor's script reads).
func ReadBundle(b []byte) (*Bundle, error) {
	in, err := jcs.Transform(b)
	if err != nil {
		return nil, fmt.Errorf("the bundle is not JSON with unique keys: %w", err)
	}
	out := &Bundle{}
	if err := json.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("the bundle is not JSON: %w", err)
	}
	if again, err := Canonical(out); err != nil || !bytes.Equal(in, again) {
		return nil, errors.New("the bundle holds fields this version does not read, keys in another case or explicit empty values: another JSON tool would read it differently")
	}
	if out.Format != BundleFormat {
		return nil, fmt.Errorf("the bundle's format is %q, want %q", out.Format, BundleFormat)
	}
	if out.Request == nil {
		return nil, errors.New("the bundle holds no request")
	}
	if out.Request.Name == "" || out.Request.Namespace == "" {
		// An export always names the request; its signed statement names
		// it too.
		return nil, errors.New("the bundle's request has no name or namespace: an export always has both")
	}
	if out.EvidenceFormat != out.Request.Status.EvidenceFormat {
		return nil, fmt.Errorf("the bundle says evidence format %q, its request %q", out.EvidenceFormat, out.Request.Status.EvidenceFormat)
	}
	if _, err := ParseKeySetValue(out.KeySet); err != nil {
		return nil, err
	}
	return out, nil
}

// ParseKeySetValue checks a key set already decoded: every key parses and
// has the ID it claims.
func ParseKeySetValue(ks KeySet) (KeySet, error) {
	raw, err := json.Marshal(ks)
	if err != nil {
		return ks, err
	}
	return ParseKeySet(raw)
}

// VerifyBundle verifies the bundle's request with trusted when given (a key
// set the auditor holds from another channel), else with the bundle's own.
func VerifyBundle(ctx context.Context, b *Bundle, trusted *KeySet, allowUnsigned bool) (*Report, error) {
	ks := b.KeySet
	if trusted != nil {
		ks = *trusted
	}
	return VerifyRequest(ctx, b.Request, Options{KeySet: ks, AllowUnsigned: allowUnsigned})
}

// Mirrored is the evidence a proof mirrored into the database carries
// beside its history and receipt: what DocumentFor and PartsOf need, with
// the session IDs as their digest only (the database keeps no list of
// what a request asked for).
type Mirrored struct {
	Format   string                 `json:"format"`
	Request  string                 `json:"request"`
	Store    string                 `json:"store"`
	Sessions string                 `json:"sessions"`
	Plan     *lethev1.ErasurePlan   `json:"plan,omitempty"`
	Steps    []lethev1.StepEvidence `json:"steps,omitempty"`
}

// MirroredOf is what the database keeps of er's evidence.
func MirroredOf(er *lethev1.ErasureRequest) Mirrored {
	m := Mirrored{Format: Format, Request: string(er.UID), Store: er.Spec.StoreRef.Name,
		Sessions: SessionsDigest(er.Spec.SessionIDs), Plan: er.Status.Plan}
	if er.Status.Evidence != nil {
		m.Steps = er.Status.Evidence.Steps
	}
	return m
}

// RequestFromProof rebuilds, from a proof mirrored into the database (its
// history, anonymous receipt and evidence), the request as far as
// verification needs it, known by UID only, and the digest of its session
// IDs (Options.SessionsDigest).
func RequestFromProof(uid, format string, history []lethev1.HistoryEntry, receipt *lethev1.Receipt, document []byte) (*lethev1.ErasureRequest, string, error) {
	er := &lethev1.ErasureRequest{}
	er.UID = k8stypes.UID(uid)
	er.Status.EvidenceFormat, er.Status.History, er.Status.Receipt = format, history, receipt
	if format == "" || len(document) == 0 {
		return er, "", nil
	}
	var m Mirrored
	if err := json.Unmarshal(document, &m); err != nil {
		return nil, "", fmt.Errorf("the mirrored evidence: %w", err)
	}
	if m.Request != uid || m.Format != format {
		return nil, "", fmt.Errorf("the mirrored evidence is of request %q, format %q", m.Request, m.Format)
	}
	er.Spec.StoreRef.Name = m.Store
	er.Status.Plan, er.Status.Evidence = m.Plan, &lethev1.ErasureEvidence{Steps: m.Steps}
	if len(history) > 0 {
		er.Status.Phase = history[len(history)-1].Phase
	}
	return er, m.Sessions, nil
}
