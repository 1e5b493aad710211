package erasure

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// Record writes an outcome into the request's status: its condition (the
// transition time from now, the manager's injected clock), plan, grace
// end, evidence and history entry, signed by key when it is not nil. It is
// pure; events and metrics are the controller's.
func Record(er *lethev1.ErasureRequest, out Outcome, now time.Time, key *evidence.Key) {
	st := &er.Status
	if c := out.Condition; c != nil && c.Type != "" {
		c = keepClaim(st.Conditions, c)
		status := metav1.ConditionFalse
		if c.OK {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: c.Type, Status: status, Reason: c.Reason, Message: c.Message,
			ObservedGeneration: er.Generation, LastTransitionTime: metav1.NewTime(now),
		})
	}
	if out.Plan != nil {
		st.Plan = out.Plan
	}
	if out.GraceEndsAt != nil {
		st.GraceEndsAt = mtime(*out.GraceEndsAt)
	}
	if out.Evidence != nil {
		setEvidence(st, *out.Evidence)
	}
	if m := out.Milestone; m != nil {
		appendEntry(er, m, key)
	}
}

// appendEntry appends the milestone's history entry. A history begun under
// the evidence format records the digest of each part of the request's
// evidence and digests them with the request (what an auditor
// recomputes); a legacy history goes on as it began.
func appendEntry(er *lethev1.ErasureRequest, m *Milestone, key *evidence.Key) {
	st := &er.Status
	if len(st.History) == 0 {
		st.EvidenceFormat = evidence.Format
	}
	e := lethev1.HistoryEntry{Phase: m.Phase, Event: m.Event, Time: metav1.NewTime(m.At)}
	var err error
	if st.EvidenceFormat == "" {
		e.EvidenceDigest, err = evidence.Digest(m.Evidence)
	} else {
		e.EvidenceParts = evidence.PartsOf(er)
		e.EvidenceDigest, err = evidence.CanonicalDigest(evidence.DocumentFor(er, e.EvidenceParts, ""))
	}
	if err != nil {
		e.EvidenceDigest = "sha256:unavailable"
	}
	c := evidence.ChainOf(er)
	c.AppendEntry(e, key)
	st.History = c.History
}

// keepClaim keeps a claimed deletion claimed: once the Deleted condition
// carries a claimed reason, a later False condition (the store not ready,
// the database unreachable, a Secret gone) is written under ReasonDeleting,
// its own reason in the message. Otherwise the next pass would claim again
// and could honour a cancel that came after the claim.
func keepClaim(conds []metav1.Condition, c *Condition) *Condition {
	if c.Type != lethev1.ConditionDeleted || c.OK || claimedReasons[c.Reason] {
		return c
	}
	prev := meta.FindStatusCondition(conds, lethev1.ConditionDeleted)
	if prev == nil || prev.Status != metav1.ConditionFalse || !claimedReasons[prev.Reason] {
		return c
	}
	kept := *c
	kept.Reason, kept.Message = lethev1.ReasonDeleting, "deletion claimed; "+c.Reason+": "+c.Message
	return &kept
}

// setEvidence replaces (or appends) the evidence of one step.
func setEvidence(st *lethev1.ErasureRequestStatus, ev lethev1.StepEvidence) {
	if st.Evidence == nil {
		st.Evidence = &lethev1.ErasureEvidence{}
	}
	for i := range st.Evidence.Steps {
		if st.Evidence.Steps[i].Step == ev.Step {
			st.Evidence.Steps[i] = ev
			return
		}
	}
	st.Evidence.Steps = append(st.Evidence.Steps, ev)
}

func mtime(t time.Time) *metav1.Time {
	m := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &m
}
