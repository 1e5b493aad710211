package evidence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	ita1 "github.com/in-toto/attestation/go/v1"
	"google.golang.org/protobuf/encoding/protojson"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Options of a verification.
type Options struct {
	// KeySet holds the public keys signatures are checked against.
	KeySet KeySet
	// AllowUnsigned accepts a history or receipt written with no key
	// configured (the chain then proves only that nothing was edited since).
	AllowUnsigned bool
}

// Report is what a verification established, for a person to read.
type Report struct {
	// Format is the evidence format ("" for the legacy chain).
	Format  string
	Entries int
	Head    string
	// SignedBy are the keys that signed the history, in order of first use.
	SignedBy []PublishedKey
	// Unsigned: the history carries no signatures (allowed by Options).
	Unsigned bool
	// InProgress: the plan or evidence changed after the last entry (a
	// request still running); the last entry's evidence is not checked.
	InProgress bool
	Receipt    *ReceiptCheck
	Log        *LogCheck
	// Checks are the checks that passed, one sentence each.
	Checks []string
}

// ReceiptCheck is what the receipt check found.
type ReceiptCheck struct {
	Signed  bool
	Key     PublishedKey
	Covers  int
	Predict *ReceiptPredicate
}

// LogCheck is the receipt's verified place in its store's log.
type LogCheck struct {
	Origin      string
	Index, Size int64
}

func (r *Report) passed(format string, args ...any) {
	r.Checks = append(r.Checks, fmt.Sprintf(format, args...))
}

// VerifyRequest verifies a request's proof as an auditor would, from the
// object alone and the key set: the chain, every entry's signature, the
// plan and step evidence against the digest the history recorded, the
// receipt's signature and statement, and its place in the store's log.
// The error names the first thing that is wrong.
func VerifyRequest(ctx context.Context, er *lethev1.ErasureRequest, opts Options) (*Report, error) {
	c := ChainOf(er)
	rep := &Report{Format: c.Format, Entries: len(c.History), Head: Head(c.History)}
	if err := VerifyChain(c); err != nil {
		return rep, fmt.Errorf("history: %w", err)
	}
	rep.passed("the history's %d entries chain and recompute (format %s)", len(c.History), formatName(c.Format))
	if err := verifyEntrySignatures(rep, c, opts); err != nil {
		return rep, err
	}
	pred, err := verifyReceipt(ctx, rep, er, opts)
	if err != nil {
		return rep, err
	}
	if err := verifyEvidence(rep, er, pred); err != nil {
		return rep, err
	}
	if err := verifyLog(rep, er, opts.KeySet); err != nil {
		return rep, err
	}
	return rep, nil
}

func formatName(f string) string {
	if f == "" {
		return "legacy, unkeyed"
	}
	return f
}

func verifyEntrySignatures(rep *Report, c Chain, opts Options) error {
	if c.Format == "" {
		if !opts.AllowUnsigned {
			return errors.New("history: the legacy chain carries no signatures: anyone allowed to write the request's status could have written it (--allow-unsigned accepts it)")
		}
		rep.Unsigned = true
		return nil
	}
	unsigned := len(c.History) > 0
	for _, e := range c.History {
		if e.Signature != "" {
			unsigned = false
		}
	}
	// A history is all signed, or (allowed) all unsigned: never a mix.
	keys, err := VerifySignatures(c, opts.KeySet, opts.AllowUnsigned && unsigned)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	rep.SignedBy, rep.Unsigned = keys, unsigned
	if !unsigned {
		ids := make([]string, len(keys))
		for i, k := range keys {
			ids[i] = shortID(k.KeyID)
		}
		rep.passed("every entry is signed by a key of the key set, current when it signed (%s)", strings.Join(ids, ", "))
	}
	return nil
}

// verifyReceipt checks the receipt: it covers an entry of the chain, and,
// signed, its statement names this request, that entry and its evidence.
func verifyReceipt(ctx context.Context, rep *Report, er *lethev1.ErasureRequest, opts Options) (*ReceiptPredicate, error) {
	r := er.Status.Receipt
	if r == nil {
		return nil, nil
	}
	at := -1
	for i, h := range er.Status.History {
		if h.Digest == r.Digest {
			at = i
		}
	}
	if at < 0 {
		return nil, fmt.Errorf("receipt: it covers digest %s, which no history entry has (a receipt of another request?)", r.Digest)
	}
	rep.Receipt = &ReceiptCheck{Covers: at + 1}
	if r.Envelope == "" {
		if !opts.AllowUnsigned {
			return nil, errors.New("receipt: unsigned (no signing key was configured); --allow-unsigned accepts it")
		}
		rep.passed("the unsigned receipt covers history entry %d", at+1)
		return nil, nil
	}
	st, key, err := openReceipt(ctx, r, opts.KeySet)
	if err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	rep.Receipt.Signed, rep.Receipt.Key = true, key
	want := strings.TrimPrefix(r.Digest, "sha256:")
	if len(st.Subject) != 1 || st.Subject[0].Digest["sha256"] != want {
		return nil, fmt.Errorf("receipt: the signed statement covers another digest than %s (a swapped receipt?)", r.Digest)
	}
	if !strings.HasSuffix(st.Subject[0].Name, "/"+string(er.UID)) {
		return nil, fmt.Errorf("receipt: the signed statement names %s, not this request (UID %s): a receipt of another request", st.Subject[0].Name, er.UID)
	}
	if er.Status.EvidenceFormat == "" {
		rep.passed("the receipt is signed by key %s and covers history entry %d", shortID(key.KeyID), at+1)
		return nil, nil
	}
	pred, err := predicateFrom(st)
	if err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	if pred.Request.UID != string(er.UID) || pred.HistoryLength != at+1 || pred.EvidenceDigest != er.Status.History[at].EvidenceDigest {
		return nil, fmt.Errorf("receipt: the signed statement does not match history entry %d of this request", at+1)
	}
	rep.Receipt.Predict = pred
	rep.passed("the receipt is signed by key %s (current %s) and covers history entry %d of %d", shortID(key.KeyID), key.Validity(), at+1, len(er.Status.History))
	return pred, nil
}

func predicateFrom(st *ita1.Statement) (*ReceiptPredicate, error) {
	if st.PredicateType != PredicateType {
		return nil, fmt.Errorf("the statement's predicate type is %q, want %q", st.PredicateType, PredicateType)
	}
	raw, err := protojson.Marshal(st.Predicate)
	if err != nil {
		return nil, err
	}
	p := &ReceiptPredicate{}
	if err := json.Unmarshal(raw, p); err != nil {
		return nil, fmt.Errorf("the statement's predicate: %w", err)
	}
	if p.Format != Format {
		return nil, fmt.Errorf("the statement's format is %q, want %q", p.Format, Format)
	}
	return p, nil
}

// verifyEvidence recomputes the evidence document and compares it with the
// digest the last entry recorded. Where they differ, the receipt's part
// digests (when it covers the last entry) name what was edited.
func verifyEvidence(rep *Report, er *lethev1.ErasureRequest, pred *ReceiptPredicate) error {
	h := er.Status.History
	if er.Status.EvidenceFormat == "" || len(h) == 0 {
		return nil
	}
	last := h[len(h)-1]
	got, err := CanonicalDigest(DocumentOf(er))
	if err != nil {
		return err
	}
	if got == last.EvidenceDigest {
		rep.passed("the plan and every step's evidence recompute to the digest history entry %d recorded", len(h))
		return nil
	}
	if er.Status.Receipt == nil && !terminal(er.Status.Phase) {
		rep.InProgress = true
		return nil
	}
	if pred != nil && pred.HistoryLength == len(h) {
		if what := editedParts(er, pred); len(what) > 0 {
			return fmt.Errorf("evidence: %s, after the receipt signed it", strings.Join(what, "; "))
		}
	}
	return fmt.Errorf("evidence: status.plan or status.evidence (or the sessions asked for) differs from what history entry %d recorded: edited after it was written", len(h))
}

func terminal(p lethev1.Phase) bool {
	return p == lethev1.PhaseBackupsRotated || p == lethev1.PhaseCancelled || p == lethev1.PhasePlanned
}

// editedParts names the parts of the evidence whose digests differ from
// the receipt's.
func editedParts(er *lethev1.ErasureRequest, pred *ReceiptPredicate) []string {
	var what []string
	if d, _ := CanonicalDigest(er.Status.Plan); d != pred.PlanDigest {
		what = append(what, "status.plan was edited")
	}
	seen := map[string]bool{}
	if er.Status.Evidence != nil {
		for _, s := range er.Status.Evidence.Steps {
			seen[s.Step] = true
			switch d, _ := CanonicalDigest(s); {
			case pred.StepDigests[s.Step] == "":
				what = append(what, fmt.Sprintf("evidence of step %s was added", s.Step))
			case d != pred.StepDigests[s.Step]:
				what = append(what, fmt.Sprintf("evidence of step %s was edited (its counts, verification results, times or backups)", s.Step))
			}
		}
	}
	var removed []string
	for step := range pred.StepDigests {
		if !seen[step] {
			removed = append(removed, step)
		}
	}
	sort.Strings(removed)
	for _, step := range removed {
		what = append(what, fmt.Sprintf("evidence of step %s was removed", step))
	}
	return what
}
