package redact_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/redact"
	"github.com/lethe-dev/lethe/internal/redact/redacttest"
)

// Thresholds the corpus holds the detectors to: no planted value of any
// detector may survive (recall 1 on the formats the detectors document),
// and at most maxNegativeRate of each look-alike class may be redacted.
const maxNegativeRate = 0.02

// Score is a detector's tally over the corpus.
type score struct{ tp, fp, fn int }

func (s score) precision() float64 { return ratio(s.tp, s.tp+s.fp) }
func (s score) recall() float64    { return ratio(s.tp, s.tp+s.fn) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}

// Scores runs redact on the corpus: per detector, and per negative class
// how many of its values were redacted; leaks are planted values left.
func scores(corpus []redacttest.Trace, redactText func(string) (string, redact.Counts)) (map[string]*score, map[string][2]int, []string) {
	per := map[string]*score{}
	for _, d := range redact.Detectors {
		per[d.Name] = &score{}
	}
	negatives := map[string][2]int{}
	var leaks []string
	for i, tr := range corpus {
		out, counts := redactText(tr.Text)
		want := map[string]int{}
		for _, p := range tr.Planted {
			if p.Detector == "" {
				n := negatives[p.Kind]
				n[1]++
				if !strings.Contains(out, p.Value) {
					n[0]++
				}
				negatives[p.Kind] = n
				continue
			}
			want[p.Detector]++
			if strings.Contains(out, p.Value) {
				leaks = append(leaks, fmt.Sprintf("trace %d: a %s value survived", i, p.Detector))
			}
		}
		for name, s := range per {
			got, w := counts[name], want[name]
			s.tp += min(got, w)
			s.fp += max(0, got-w)
			s.fn += max(0, w-got)
		}
	}
	return per, negatives, leaks
}

// table renders the scores as the closing note's table.
func table(per map[string]*score, negatives map[string][2]int) string {
	var b strings.Builder
	b.WriteString("| detector | found | false positives | missed | precision | recall |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, d := range redact.Detectors {
		s := per[d.Name]
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.3f | %.3f |\n", d.Name, s.tp, s.fp, s.fn, s.precision(), s.recall())
	}
	b.WriteString("\n| look-alike negative | redacted / planted |\n| --- | --- |\n")
	kinds := make([]string, 0, len(negatives))
	for k := range negatives {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "| %s | %d / %d |\n", k, negatives[k][0], negatives[k][1])
	}
	return b.String()
}

// The regression corpus: every detector's positives redacted, look-alikes
// kept, within the thresholds above.
func TestTheRedactorOnTheRegressionCorpus(t *testing.T) {
	corpus := redacttest.Corpus(20261201, 3000)
	per, negatives, leaks := scores(corpus, redact.Text)
	t.Logf("precision and recall over %d traces:\n%s", len(corpus), table(per, negatives))
	for _, l := range leaks[:min(len(leaks), 10)] {
		t.Error(l)
	}
	for _, d := range redacttest.Detectors() {
		if s := per[d]; s.tp == 0 || s.recall() < 1 {
			t.Errorf("detector %s: recall %.3f over %d planted values, want 1", d, s.recall(), s.tp+s.fn)
		}
	}
	for k, n := range negatives {
		if rate := ratio(n[0], n[1]); n[0] > 0 && rate > maxNegativeRate {
			t.Errorf("%d of %d %q look-alikes redacted (%.1f%%), above %.0f%%", n[0], n[1], k, 100*rate, 100*maxNegativeRate)
		}
	}
}
