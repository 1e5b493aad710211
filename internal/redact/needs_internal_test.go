package redact

import (
	"testing"

	"github.com/lethe-dev/lethe/internal/redact/redacttest"
)

// Needs and NeedsDigit only skip text no pattern could match: every match
// in the corpus passes its detector's prefilter.
func TestTheNeedsOfEachDetectorAreNecessary(t *testing.T) {
	for _, tr := range redacttest.Corpus(99, 3000) {
		for i, d := range Detectors {
			for _, m := range compiled[i].FindAllString(tr.Text, -1) {
				if !d.mayMatch(m) {
					t.Fatalf("detector %s matches %q, which its prefilter would skip", d.Name, m)
				}
			}
		}
	}
}
