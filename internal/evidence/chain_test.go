package evidence_test

import (
	"errors"
	"testing"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

func chain(t *testing.T) []lethev1.HistoryEntry {
	t.Helper()
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var h []lethev1.HistoryEntry
	for i, p := range []lethev1.Phase{lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod, lethev1.PhaseDeleted} {
		d, err := evidence.Digest(map[string]int{"step": i})
		if err != nil {
			t.Fatal(err)
		}
		h = evidence.Append(h, p, "", at.Add(time.Duration(i)*time.Hour+123*time.Millisecond), d)
	}
	return h
}

func TestChainVerifies(t *testing.T) {
	h := chain(t)
	if err := evidence.Verify(h); err != nil {
		t.Fatal(err)
	}
	if h[0].PreviousDigest != "" || h[1].PreviousDigest != h[0].Digest || evidence.Head(h) != h[2].Digest {
		t.Fatalf("entries are not linked: %+v", h)
	}
}

func TestTamperingIsDetectedAtTheRightEntry(t *testing.T) {
	cases := map[string]struct {
		tamper func([]lethev1.HistoryEntry) []lethev1.HistoryEntry
		index  int
	}{
		"edited phase":    {func(h []lethev1.HistoryEntry) []lethev1.HistoryEntry { h[1].Phase = lethev1.PhaseCancelled; return h }, 1},
		"edited evidence": {func(h []lethev1.HistoryEntry) []lethev1.HistoryEntry { h[2].EvidenceDigest = "sha256:00"; return h }, 2},
		"edited time": {func(h []lethev1.HistoryEntry) []lethev1.HistoryEntry {
			h[0].Time.Time = h[0].Time.Add(time.Hour)
			return h
		}, 0},
		"dropped entry": {func(h []lethev1.HistoryEntry) []lethev1.HistoryEntry { return append(h[:1], h[2:]...) }, 1},
		"dropped first": {func(h []lethev1.HistoryEntry) []lethev1.HistoryEntry { return h[1:] }, 0},
		"swapped":       {func(h []lethev1.HistoryEntry) []lethev1.HistoryEntry { h[1], h[2] = h[2], h[1]; return h }, 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := evidence.Verify(tc.tamper(chain(t)))
			var ve *evidence.VerifyError
			if !errors.As(err, &ve) || ve.Index != tc.index {
				t.Fatalf("got %v, want a VerifyError at entry %d", err, tc.index)
			}
		})
	}
}

func TestDigestIsStable(t *testing.T) {
	a, _ := evidence.Digest(map[string]int{"b": 2, "a": 1})
	b, _ := evidence.Digest(map[string]int{"a": 1, "b": 2})
	if a != b || len(a) != len("sha256:")+64 {
		t.Fatalf("digests %q %q", a, b)
	}
}
