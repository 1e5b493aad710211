package evidence_test

import (
	"testing"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// FuzzVerify: any change to any field of any entry of a valid chain is
// detected, and no input makes the verifier panic.
func FuzzVerify(f *testing.F) {
	f.Add(0, 0, "x")
	f.Add(2, 3, "")
	f.Add(1, 1, "sha256:00")
	f.Fuzz(func(t *testing.T, entry, field int, value string) {
		at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
		var h []lethev1.HistoryEntry
		for i, p := range []lethev1.Phase{lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod, lethev1.PhaseDeleted} {
			h = evidence.Append(h, p, "", at.Add(time.Duration(i)*time.Hour), "sha256:aa")
		}
		e := &h[((entry%3)+3)%3]
		before := *e
		switch ((field % 6) + 6) % 6 {
		case 0:
			e.Phase = lethev1.Phase(value)
		case 1:
			e.Event = value
		case 2:
			e.EvidenceDigest = value
		case 3:
			e.PreviousDigest = value
		case 4:
			e.Digest = value
		case 5:
			e.Time.Time = e.Time.Add(time.Duration(len(value)) * time.Second)
		}
		err := evidence.Verify(h)
		if *e == before {
			if err != nil {
				t.Fatalf("an unchanged chain does not verify: %v", err)
			}
			return
		}
		if err == nil {
			t.Fatalf("changed %+v to %+v and the chain still verifies", before, *e)
		}
	})
}
