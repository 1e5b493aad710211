package evidence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

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
	// SessionsDigest stands for the request's session IDs when only their
	// digest is known (a proof read back from the database).
	SessionsDigest string
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
	// InProgress: the last history entry is not a final one and the
	// evidence of a step not yet settled changed since: a request still
	// running, whose proof is not complete.
	InProgress bool
	// Unlogged: the signed receipt has no place in the store's receipt log yet.
	Unlogged bool
	// milestones: the entries the receipt covers reach every milestone of
	// an erasure, in order.
	milestones bool
	Receipt    *ReceiptCheck
	Log        *LogCheck
	// Checks are the checks that passed, one sentence each.
	Checks []string
}

// Complete reports whether the verification proves a finished erasure
// with nothing left unchecked: signed, final, with a receipt in the log.
func (r *Report) Complete() bool { return r.Incomplete() == "" }

// Incomplete says what keeps a verification that passed from being a
// complete proof of erasure; empty when nothing does.
func (r *Report) Incomplete() string {
	switch {
	case r.Unsigned:
		return "unsigned: the history proves only that nothing was edited since it was written"
	case r.InProgress:
		return "in progress: the request has not finished; its evidence so far verifies"
	case r.Receipt == nil:
		return "no receipt: the request did not complete an erasure (cancelled, planned or still running)"
	case !r.milestones:
		return "the receipt does not cover a history that reached every milestone (Tombstoned, GracePeriod, Deleted, GraphReconciled, BackupsRotated)"
	case !r.Receipt.Signed:
		return "the receipt is unsigned"
	case r.Unlogged || r.Log == nil:
		return "the receipt has no place in the store's receipt log yet"
	}
	return ""
}

// ReceiptCheck is what the receipt check found.
type ReceiptCheck struct {
	Signed    bool
	Key       PublishedKey
	Covers    int
	Predicate *ReceiptPredicate
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
// object alone and the key set: the chain, every entry's signature, every
// entry's evidence digest, the evidence as it stands against what the
// history recorded, the receipt's signature and statement (identity,
// dates, the covered entry), and its place in the store's log. The error
// names the first thing that is wrong.
func VerifyRequest(ctx context.Context, er *lethev1.ErasureRequest, opts Options) (*Report, error) {
	c := ChainOf(er)
	rep := &Report{Format: c.Format, Entries: len(c.History), Head: Head(c.History)}
	if len(c.History) == 0 {
		return rep, errors.New("history: the request has no history: nothing to verify")
	}
	if err := VerifyChain(c); err != nil {
		return rep, fmt.Errorf("history: %w", err)
	}
	rep.passed("the history's %d entries chain and recompute (format %s)", len(c.History), formatName(c.Format))
	if err := verifyEntrySignatures(rep, c, opts); err != nil {
		return rep, err
	}
	if err := verifyEvidence(rep, er, opts); err != nil {
		return rep, err
	}
	if _, err := verifyReceipt(ctx, rep, er, opts); err != nil {
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
	unsigned := true
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
		rep.passed("every entry is signed by a key of the key set, not retired when it signed (%s)", strings.Join(ids, ", "))
	}
	return nil
}

// verifyEvidence checks every entry's evidence digest against its parts
// and the request, that no entry changed evidence that had settled, and
// the evidence as it stands against the last entry.
func verifyEvidence(rep *Report, er *lethev1.ErasureRequest, opts Options) error {
	h := er.Status.History
	if er.Status.EvidenceFormat == "" {
		return nil
	}
	for i, e := range h {
		d, err := CanonicalDigest(DocumentFor(er, e.EvidenceParts, opts.SessionsDigest))
		if err != nil {
			return err
		}
		if d != e.EvidenceDigest {
			return fmt.Errorf("evidence: history entry %d's evidence digest does not cover its parts for this request, store and sessions (spec.storeRef or spec.sessionIDs edited?)", i)
		}
	}
	if err := CheckStepNames(er); err != nil {
		return fmt.Errorf("evidence: %w", err)
	}
	if err := CheckParts(h); err != nil {
		return fmt.Errorf("evidence: %w", err)
	}
	last := h[len(h)-1]
	cur := PartsOf(er)
	if err := changedSettled(h, lethev1.HistoryEntry{EvidenceParts: cur}); err != nil {
		return fmt.Errorf("evidence: %w", err)
	}
	var open []string
	for part, d := range cur {
		if last.EvidenceParts[part] != d {
			open = append(open, part)
		}
	}
	sort.Strings(open)
	if len(open) > 0 {
		if last.Phase.Final() {
			return fmt.Errorf("evidence: %s changed after the last history entry (%s), which ended the request", partNames(open), last.Phase)
		}
		rep.InProgress = true
		return nil
	}
	rep.passed("the plan and every step's evidence recompute to the digests the history recorded (entry %d of %d)", len(h), len(h))
	return nil
}

func partNames(parts []string) string {
	out := make([]string, len(parts))
	for i, p := range parts {
		if p == PlanPart {
			out[i] = "status.plan"
		} else {
			out[i] = "the evidence of step " + p
		}
	}
	return strings.Join(out, ", ")
}

// verifyReceipt checks the receipt: a history that ended has one; it
// covers an entry of the chain, and, signed, its statement names exactly
// this request, its store, dates and that entry.
func verifyReceipt(ctx context.Context, rep *Report, er *lethev1.ErasureRequest, opts Options) (*ReceiptPredicate, error) {
	r, h := er.Status.Receipt, er.Status.History
	if r == nil {
		// A completed erasure has a receipt; a cancel or a plan has none.
		if last := h[len(h)-1]; last.Phase == lethev1.PhaseBackupsRotated {
			return nil, fmt.Errorf("receipt: the history ended (%s) but the request has no receipt (removed?)", last.Phase)
		}
		return nil, nil
	}
	at := -1
	for i, e := range h {
		if e.Digest == r.Digest {
			at = i
		}
	}
	if at < 0 {
		return nil, fmt.Errorf("receipt: it covers digest %s, which no history entry has (a receipt of another request?)", r.Digest)
	}
	rep.Receipt = &ReceiptCheck{Covers: at + 1}
	rep.milestones = reachedEvery(h[:at+1])
	if r.Envelope == "" {
		if !opts.AllowUnsigned || !rep.Unsigned {
			return nil, errors.New("receipt: unsigned (no signing key was configured); --allow-unsigned accepts it for an unsigned history")
		}
		rep.passed("the unsigned receipt covers history entry %d", at+1)
		return nil, nil
	}
	st, key, err := openReceipt(ctx, r, opts.KeySet)
	if err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	rep.Receipt.Signed, rep.Receipt.Key = true, key
	if err := checkSubject(st, er, r.Digest); err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	if er.Status.EvidenceFormat == "" {
		rep.passed("the receipt is signed by key %s and covers history entry %d", shortID(key.KeyID), at+1)
		return nil, nil
	}
	pred, err := predicateFrom(st)
	if err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	if err := checkPredicate(pred, er, at, opts); err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	issued, err := time.Parse(time.RFC3339, pred.IssuedAt)
	if err != nil {
		return nil, fmt.Errorf("receipt: the signed issuedAt %q is not a time", pred.IssuedAt)
	}
	if r.IssuedAt != nil && rfc3339(&r.IssuedAt.Time) != pred.IssuedAt {
		return nil, fmt.Errorf("receipt: status.receipt.issuedAt %s is not the signed %s (edited?)", rfc3339(&r.IssuedAt.Time), pred.IssuedAt)
	}
	if key, err = opts.KeySet.currentAt(r.KeyID, issued); err != nil {
		return nil, fmt.Errorf("receipt: %w", err)
	}
	rep.Receipt.Key, rep.Receipt.Predicate = key, pred
	rep.passed("the receipt is signed by key %s (%s), names this request and covers history entry %d of %d", shortID(key.KeyID), key.Validity(), at+1, len(h))
	return pred, nil
}

// checkSubject: the statement's one subject is exactly this request (or,
// for the anonymous receipt, its UID) and the covered digest.
func checkSubject(st *ita1.Statement, er *lethev1.ErasureRequest, digest string) error {
	want := "erasurerequest/" + er.Namespace + "/" + er.Name + "/" + string(er.UID)
	if er.Name == "" {
		want = "erasurerequest/" + string(er.UID)
	}
	if len(st.Subject) != 1 || st.Subject[0].Digest["sha256"] != strings.TrimPrefix(digest, "sha256:") {
		return fmt.Errorf("the signed statement covers another digest than %s (a swapped receipt?)", digest)
	}
	if st.Subject[0].Name != want {
		return fmt.Errorf("the signed statement names %s, not this request (%s): a receipt of another request, or the request's name, namespace or UID edited", st.Subject[0].Name, want)
	}
	return nil
}

// checkPredicate compares what the receipt signed with the request.
func checkPredicate(pred *ReceiptPredicate, er *lethev1.ErasureRequest, at int, opts Options) error {
	e := er.Status.History[at]
	if pred.Request.UID != string(er.UID) || pred.HistoryLength != at+1 || pred.HistoryHead != e.Digest || pred.EvidenceDigest != e.EvidenceDigest {
		return fmt.Errorf("the signed statement does not match history entry %d of this request", at+1)
	}
	if noPlan := pred.PlanDigest == mustDigest(nil) && e.EvidenceParts[PlanPart] == ""; pred.PlanDigest != e.EvidenceParts[PlanPart] && !noPlan {
		return fmt.Errorf("the signed statement's plan digest is not the one history entry %d recorded", at+1)
	}
	for step, d := range pred.StepDigests {
		if e.EvidenceParts[step] != d {
			return fmt.Errorf("the signed statement's digest of step %s is not the one history entry %d recorded", step, at+1)
		}
	}
	if pred.Store != er.Spec.StoreRef.Name {
		return fmt.Errorf("the signed statement names store %q, the request %q", pred.Store, er.Spec.StoreRef.Name)
	}
	if pred.Phase != string(e.Phase) {
		return fmt.Errorf("the signed statement says phase %s, the covered entry %s", pred.Phase, e.Phase)
	}
	if opts.SessionsDigest != "" {
		return nil // a proof from the database: no name, dates or IDs to compare
	}
	// A request without a name is compared too (its anonymous receipt
	// signed the same dates): otherwise clearing the name would let its
	// dates be edited.
	if pred.Request.Name != er.Name || pred.Request.Namespace != er.Namespace {
		return fmt.Errorf("the signed statement names %s/%s, the request is %s/%s", pred.Request.Namespace, pred.Request.Name, er.Namespace, er.Name)
	}
	requested := er.CreationTimestamp.Time
	if er.Spec.RequestedAt != nil {
		requested = er.Spec.RequestedAt.Time
	}
	deadline := ""
	if er.Status.Deadline != nil {
		deadline = rfc3339(&er.Status.Deadline.Time)
	}
	if pred.RequestedAt != rfc3339(&requested) || pred.Deadline != deadline || pred.Sessions != len(er.Spec.SessionIDs) {
		return fmt.Errorf("the signed statement says requested %s, deadline %s, %d session(s); the request says %s, %s, %d (edited?)",
			pred.RequestedAt, pred.Deadline, pred.Sessions, rfc3339(&requested), deadline, len(er.Spec.SessionIDs))
	}
	return nil
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

// erasureMilestones are the phases an erasure reaches, in order.
var erasureMilestones = []lethev1.Phase{lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod, lethev1.PhaseDeleted,
	lethev1.PhaseGraphReconciled, lethev1.PhaseBackupsRotated}

// reachedEvery reports whether h reaches every erasure milestone in order
// (Resurrected entries aside) and ends at the last one.
func reachedEvery(h []lethev1.HistoryEntry) bool {
	next := 0
	for _, e := range h {
		if e.Event == lethev1.ReasonResurrected {
			continue
		}
		if next < len(erasureMilestones) && e.Phase == erasureMilestones[next] {
			next++
		}
	}
	return next == len(erasureMilestones) && len(h) > 0 && h[len(h)-1].Phase == lethev1.PhaseBackupsRotated
}
