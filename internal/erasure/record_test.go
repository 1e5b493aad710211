package erasure

import (
	"maps"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

func TestRecordCondition(t *testing.T) {
	const gen = 7
	at := func(status metav1.ConditionStatus, reason string, gen int64, when time.Time) metav1.Condition {
		return metav1.Condition{Type: lethev1.ConditionDeleted, Status: status, Reason: reason, Message: reason + " message",
			ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(when)}
	}
	ok := &Condition{Type: lethev1.ConditionDeleted, OK: true, Reason: lethev1.ReasonSessionsDeleted, Message: lethev1.ReasonSessionsDeleted + " message"}
	notYet := &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonReplicaLagging, Message: lethev1.ReasonReplicaLagging + " message"}
	cases := map[string]struct {
		reason string
		conds  []metav1.Condition
		out    Outcome
		want   []metav1.Condition
	}{
		"New": {reason: "A new condition carries the request's generation and the given time (the manager's clock).",
			out: Outcome{Condition: ok}, want: []metav1.Condition{at(metav1.ConditionTrue, lethev1.ReasonSessionsDeleted, gen, now)}},
		"SameStatus": {reason: "A new reason without a change of status keeps the transition time, and takes the generation.",
			conds: []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonDeleting, 3, before)},
			out:   Outcome{Condition: notYet}, want: []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonReplicaLagging, gen, before)}},
		"StatusChanges": {reason: "A change of status moves the transition time to the given time.",
			conds: []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonReplicaLagging, 3, before)},
			out:   Outcome{Condition: ok}, want: []metav1.Condition{at(metav1.ConditionTrue, lethev1.ReasonSessionsDeleted, gen, now)}},
		"NoCondition": {reason: "An outcome without a condition (an error, a claim conflict) leaves the conditions as they are.",
			conds: []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonDeleting, 3, before)},
			out:   Outcome{Kind: Errored, Err: errPort}, want: []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonDeleting, 3, before)}},
		"ClaimKept": {reason: "After the claim, a False Deleted condition with an unclaimed reason (the database unreachable) is written under Deleting, its reason in the message: the next pass must not claim again.",
			conds: []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonDeleting, 3, before)},
			out:   Outcome{Condition: &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonDatabaseUnavailable, Message: "unreachable"}},
			want: []metav1.Condition{{Type: lethev1.ConditionDeleted, Status: metav1.ConditionFalse, Reason: lethev1.ReasonDeleting,
				Message: "deletion claimed; DatabaseUnavailable: unreachable", ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(before)}}},
		"UnclaimedReasonBeforeClaim": {reason: "Before the claim, an unclaimed reason is written as it is.",
			conds: []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonStoreNotReady, 3, before)},
			out:   Outcome{Condition: &Condition{Type: lethev1.ConditionDeleted, Reason: lethev1.ReasonDatabaseUnavailable, Message: lethev1.ReasonDatabaseUnavailable + " message"}},
			want:  []metav1.Condition{at(metav1.ConditionFalse, lethev1.ReasonDatabaseUnavailable, gen, before)}},
		"UntypedCondition": {reason: "A condition without a type is not written.",
			out: Outcome{Condition: &Condition{OK: true, Reason: "X", Message: "x"}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			er := newRequest(func(er *lethev1.ErasureRequest) { er.Generation, er.Status.Conditions = gen, tc.conds })
			Record(er, tc.out, now, nil)
			if diff := cmp.Diff(tc.want, er.Status.Conditions, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s\nconditions: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestRecordPlanGraceEvidence(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	tomb := lethev1.StepEvidence{Step: lethev1.ConditionTombstoned, Note: "tombstoned"}
	del := lethev1.StepEvidence{Step: lethev1.ConditionDeleted, Note: "first pass"}
	del2 := lethev1.StepEvidence{Step: lethev1.ConditionDeleted, Note: "second pass"}
	graph := lethev1.StepEvidence{Step: lethev1.ConditionGraphReconciled, Note: "pruned"}
	plan := &lethev1.ErasurePlan{SessionsFound: 2, Embeddings: 5}
	cases := map[string]struct {
		reason string
		steps  []lethev1.StepEvidence
		out    Outcome
		want   recorded
	}{
		"PlanAndGrace": {reason: "The plan replaces the status's; the grace end is stored in whole seconds, UTC.",
			out:  Outcome{Plan: plan, GraceEndsAt: ptr(time.Date(2030, 1, 17, 13, 0, 0, 999_000_000, cet))},
			want: recorded{Plan: plan, GraceEndsAt: secs(time.Date(2030, 1, 17, 12, 0, 0, 0, time.UTC))}},
		"FirstEvidence": {reason: "The first evidence creates the list.",
			out: Outcome{Evidence: &tomb}, want: recorded{Evidence: []lethev1.StepEvidence{tomb}}},
		"EvidenceReplacedInPlace": {reason: "A step's evidence replaces its own entry, in place; the others stay.",
			steps: []lethev1.StepEvidence{tomb, del, graph}, out: Outcome{Evidence: &del2},
			want: recorded{Evidence: []lethev1.StepEvidence{tomb, del2, graph}}},
		"EvidenceAppended": {reason: "A step without evidence yet is appended, in the order the steps ran.",
			steps: []lethev1.StepEvidence{tomb, del}, out: Outcome{Evidence: &graph},
			want: recorded{Evidence: []lethev1.StepEvidence{tomb, del, graph}}},
		"NothingToRecord": {reason: "An outcome without plan, grace or evidence leaves them as they are.",
			steps: []lethev1.StepEvidence{tomb}, out: Outcome{Kind: Waiting, RequeueAfter: time.Second},
			want: recorded{Evidence: []lethev1.StepEvidence{tomb}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			er := newRequest()
			if tc.steps != nil {
				er.Status.Evidence = &lethev1.ErasureEvidence{Steps: tc.steps}
			}
			Record(er, tc.out, now, nil)
			if diff := cmp.Diff(tc.want, recordedOf(er), statusOpts); diff != "" {
				t.Errorf("%s\nstatus: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestRecordHistory(t *testing.T) {
	first := evidence.Append(nil, lethev1.PhaseTombstoned, "", before, "sha256:fixture")[0]
	ev := map[string]string{"graceEndsAt": "2030-01-17T11:00:00Z"}
	entry := func(prev string, phase lethev1.Phase, event string, at time.Time, evDigest string) lethev1.HistoryEntry {
		e := lethev1.HistoryEntry{Phase: phase, Event: event, Time: *secs(at), EvidenceDigest: evDigest, PreviousDigest: prev}
		e.Digest = evidence.LegacyEntryDigest(e)
		return e
	}
	evDigest, err := evidence.Digest(ev)
	if err != nil {
		t.Fatal(err)
	}
	grace := entry(first.Digest, lethev1.PhaseGracePeriod, "", dbNow, evDigest)
	cases := map[string]struct {
		reason  string
		history []lethev1.HistoryEntry
		outs    []Outcome
		want    []lethev1.HistoryEntry
	}{
		"Chained": {reason: "Each entry's previousDigest is the digest of the entry before it; a legacy history goes on as it began.",
			history: []lethev1.HistoryEntry{first},
			outs: []Outcome{{Milestone: &Milestone{Phase: lethev1.PhaseGracePeriod, At: dbNow, Evidence: ev}},
				{Milestone: &Milestone{Phase: lethev1.PhaseGracePeriod, Event: lethev1.ReasonResurrected, At: now, Evidence: ev}}},
			want: []lethev1.HistoryEntry{first, grace, entry(grace.Digest, lethev1.PhaseGracePeriod, lethev1.ReasonResurrected, now, evDigest)}},
		"UnencodableEvidence": {reason: "Evidence that cannot be encoded still gets an entry, marked unavailable, and the chain holds.",
			history: []lethev1.HistoryEntry{first},
			outs:    []Outcome{{Milestone: &Milestone{Phase: lethev1.PhaseDeleted, At: now, Evidence: func() {}}}},
			want:    []lethev1.HistoryEntry{first, entry(first.Digest, lethev1.PhaseDeleted, "", now, "sha256:unavailable")}},
		"NoMilestone": {reason: "An outcome without a milestone adds no entry.",
			history: []lethev1.HistoryEntry{first}, outs: []Outcome{{Condition: elapsedCond}}, want: []lethev1.HistoryEntry{first}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			er := newRequest(func(er *lethev1.ErasureRequest) { er.Status.History = tc.history })
			for _, out := range tc.outs {
				Record(er, out, now, nil)
			}
			if diff := cmp.Diff(tc.want, er.Status.History); diff != "" {
				t.Errorf("%s\nhistory: -want, +got:\n%s", tc.reason, diff)
			}
			if err := evidence.VerifyChain(evidence.ChainOf(er)); err != nil {
				t.Errorf("%s\nthe chain does not verify: %v", tc.reason, err)
			}
		})
	}
}

// The first entry starts the evidence format: no previous digest, its time
// in whole seconds, UTC, the parts of the evidence as they stand, a digest
// an auditor recomputes, and the manager's signature.
func TestRecordFirstEntryStartsTheEvidenceFormat(t *testing.T) {
	key, err := evidence.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	er := newRequest(func(*lethev1.ErasureRequest) {})
	plan := &lethev1.ErasurePlan{SessionsFound: 1}
	Record(er, Outcome{Plan: plan, Milestone: &Milestone{Phase: lethev1.PhaseTombstoned, At: dbNow.In(time.FixedZone("X", -5*3600))}}, now, key)
	h := er.Status.History
	if er.Status.EvidenceFormat != evidence.Format || len(h) != 1 {
		t.Fatalf("format %q, history %+v", er.Status.EvidenceFormat, h)
	}
	e := h[0]
	if e.PreviousDigest != "" || !e.Time.Time.Equal(dbNow.Truncate(time.Second)) || e.Time.Location() != time.UTC {
		t.Errorf("first entry %+v", e)
	}
	if !maps.Equal(e.EvidenceParts, evidence.PartsOf(er)) || e.EvidenceParts[evidence.PlanPart] == "" {
		t.Errorf("parts %v, want the plan's digest", e.EvidenceParts)
	}
	if d, _ := evidence.CanonicalDigest(evidence.DocumentFor(er, e.EvidenceParts, "")); d != e.EvidenceDigest {
		t.Errorf("evidence digest %s, recomputed %s", e.EvidenceDigest, d)
	}
	if e.KeyID != key.ID() || e.Signature == "" || e.Digest != evidence.EntryDigestV1(string(er.UID), e) {
		t.Errorf("entry not signed or digest wrong: %+v", e)
	}
}
