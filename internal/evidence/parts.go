package evidence

import (
	"fmt"
	"sort"
	"strings"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// PlanPart names the plan among the evidence parts.
const PlanPart = "plan"

// stepNames are the only evidence steps Lethe writes, each at most once.
var stepNames = map[string]bool{
	lethev1.ConditionTombstoned: true, lethev1.ConditionDeleted: true, lethev1.ConditionGraphReconciled: true,
	lethev1.ConditionBackupsRotated: true, lethev1.ReasonResurrected: true, lethev1.ReasonCancelled: true,
}

// CheckStepNames refuses evidence with a step Lethe never writes or a step
// twice (either would let one step's evidence hide behind another's).
func CheckStepNames(er *lethev1.ErasureRequest) error {
	if er.Status.Evidence == nil {
		return nil
	}
	seen := map[string]bool{}
	for _, s := range er.Status.Evidence.Steps {
		if !stepNames[s.Step] {
			return fmt.Errorf("status.evidence has a step %q Lethe never writes", s.Step)
		}
		if seen[s.Step] {
			return fmt.Errorf("status.evidence has step %s twice", s.Step)
		}
		seen[s.Step] = true
	}
	return nil
}

// PartsOf is the digest of each part of er's evidence as it stands: the
// plan ("plan") and each step's evidence (by step name).
func PartsOf(er *lethev1.ErasureRequest) map[string]string {
	parts := map[string]string{}
	if er.Status.Plan != nil {
		parts[PlanPart] = mustDigest(er.Status.Plan)
	}
	if er.Status.Evidence != nil {
		for _, s := range er.Status.Evidence.Steps {
			parts[s.Step] = mustDigest(s)
		}
	}
	return parts
}

func mustDigest(v any) string {
	d, err := CanonicalDigest(v)
	if err != nil {
		panic(err) // API types of strings, integers and times: cannot fail
	}
	return d
}

// settledBy is the phase of the entry after which a part never changes
// again: the plan once the sessions are tombstoned (or planned), a step's
// evidence once its milestone is reached. The Resurrected step is written
// anew by each Resurrected entry; parts not listed settle when first recorded.
var settledBy = map[string][]lethev1.Phase{
	PlanPart:                         {lethev1.PhaseTombstoned, lethev1.PhasePlanned},
	lethev1.ConditionTombstoned:      {lethev1.PhaseTombstoned},
	lethev1.ConditionDeleted:         {lethev1.PhaseDeleted},
	lethev1.ConditionGraphReconciled: {lethev1.PhaseGraphReconciled},
	lethev1.ConditionBackupsRotated:  {lethev1.PhaseBackupsRotated},
}

// settled reports whether part may no longer change after history h.
func settled(part string, h []lethev1.HistoryEntry) bool {
	phases, ok := settledBy[part]
	for _, e := range h {
		if _, recorded := e.EvidenceParts[part]; !recorded {
			continue
		}
		if !ok {
			return true
		}
		for _, p := range phases {
			if e.Phase == p && e.Event != lethev1.ReasonResurrected {
				return true
			}
		}
	}
	return false
}

// rewrites reports whether entry e may record a new value of part.
func rewrites(e lethev1.HistoryEntry, part string) bool {
	return part == lethev1.ReasonResurrected && e.Event == lethev1.ReasonResurrected
}

// PartError names the evidence parts changed after they were recorded.
type PartError struct {
	// Entry is the history entry (index) that last recorded them.
	Entry int
	// Parts were changed, Removed are gone.
	Parts, Removed []string
}

func (e *PartError) Error() string {
	var what []string
	for _, p := range e.Parts {
		if p == PlanPart {
			what = append(what, "status.plan was edited")
		} else {
			what = append(what, fmt.Sprintf("evidence of step %s was edited (its counts, verification results, times or backups)", p))
		}
	}
	for _, p := range e.Removed {
		if p == PlanPart {
			what = append(what, "status.plan was removed")
		} else {
			what = append(what, fmt.Sprintf("evidence of step %s was removed", p))
		}
	}
	return fmt.Sprintf("%s after history entry %d recorded it", strings.Join(what, "; "), e.Entry)
}

// changedSettled lists the parts of next that differ from the history's
// last record of them although they had settled (and next does not
// rewrite them); removed parts count as changed.
func changedSettled(h []lethev1.HistoryEntry, next lethev1.HistoryEntry) *PartError {
	if len(h) == 0 {
		return nil
	}
	last := h[len(h)-1]
	pe := &PartError{Entry: len(h) - 1}
	for part, d := range last.EvidenceParts {
		now, ok := next.EvidenceParts[part]
		switch {
		case now == d || rewrites(next, part) || !settled(part, h):
		case !ok:
			pe.Removed = append(pe.Removed, part)
		default:
			pe.Parts = append(pe.Parts, part)
		}
	}
	if len(pe.Parts)+len(pe.Removed) == 0 {
		return nil
	}
	sort.Strings(pe.Parts)
	sort.Strings(pe.Removed)
	return pe
}

// CheckParts checks that no entry of the history changed a part that had
// settled before it. A signed history passes by construction: the manager
// checks before it appends (Unchanged).
func CheckParts(h []lethev1.HistoryEntry) error {
	for j := 1; j < len(h); j++ {
		if err := changedSettled(h[:j], h[j]); err != nil {
			return fmt.Errorf("history entry %d changed settled evidence: %w", j, err)
		}
	}
	return nil
}

// Unchanged checks the request's evidence as it stands against what its
// history recorded: a settled part that differs was edited by someone
// else than the manager (which changes a settled part only with an entry
// that rewrites it), and a part the history has not recorded may only be
// the evidence of the step the request is on (current; Lethe writes a
// step's evidence before its milestone only while it works on it). The
// manager runs it before it signs anything.
func Unchanged(er *lethev1.ErasureRequest, current string) error {
	if er.Status.EvidenceFormat == "" {
		return nil
	}
	if err := CheckStepNames(er); err != nil {
		return err
	}
	cur := lethev1.HistoryEntry{EvidenceParts: PartsOf(er)}
	if err := changedSettled(er.Status.History, cur); err != nil {
		return err
	}
	var last map[string]string
	if h := er.Status.History; len(h) > 0 {
		last = h[len(h)-1].EvidenceParts
	}
	for part := range cur.EvidenceParts {
		if _, recorded := last[part]; !recorded && part != current {
			return fmt.Errorf("%s appeared without a history entry, and the request is not on that step", partNames([]string{part}))
		}
	}
	return nil
}
