package postgres

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// numbered is n words w1 ... wn joined by sep.
func numbered(n int, sep string) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("w%d", i+1)
	}
	return strings.Join(w, sep)
}

func TestPassageAndShingles(t *testing.T) {
	cases := map[string]struct {
		in       string
		passage  string
		shingles []string
	}{
		"too short": {in: numbered(15, " "), passage: ""},
		"two shingles": {in: "  " + numbered(17, " ") + " ", passage: numbered(17, " "),
			shingles: []string{numbered(8, " "), "w9 w10 w11 w12 w13 w14 w15 w16"}},
		"separators kept": {in: "w1\nw2  w3\tw4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16",
			passage:  "w1\nw2  w3\tw4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16",
			shingles: []string{"w1\nw2  w3\tw4 w5 w6 w7 w8", "w9 w10 w11 w12 w13 w14 w15 w16"}},
		"first 32 words only": {in: numbered(50, " "), passage: numbered(32, " "),
			shingles: []string{numbered(8, " "), "w9 w10 w11 w12 w13 w14 w15 w16", "w17 w18 w19 w20 w21 w22 w23 w24", "w25 w26 w27 w28 w29 w30 w31 w32"}},
		"multibyte": {in: strings.Repeat("é ", 16), passage: strings.TrimSpace(strings.Repeat("é ", 16)),
			shingles: []string{strings.TrimSpace(strings.Repeat("é ", 8)), strings.TrimSpace(strings.Repeat("é ", 8))}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := passage(tc.in)
			if p != tc.passage {
				t.Fatalf("passage(%q) = %q, want %q", tc.in, p, tc.passage)
			}
			if p == "" {
				return
			}
			if diff := cmp.Diff(tc.shingles, shingles(p)); diff != "" {
				t.Errorf("shingles: -want, +got:\n%s", diff)
			}
			for _, s := range shingles(p) {
				if !strings.Contains(tc.in, s) {
					t.Errorf("shingle %q is not a substring of the text: a verbatim copy would not hold it", s)
				}
			}
		})
	}
}

// TestShingleSetThreshold: a copy holds at least half of a passage's
// shingles, never fewer than two.
func TestShingleSetThreshold(t *testing.T) {
	set := newShingleSet([]erasure.TextSample{
		erasure.TextSample(numbered(16, " ")), // 2 shingles: both
		erasure.TextSample(numbered(24, " ")), // 3: two
		erasure.TextSample(numbered(40, " ")), // 4 (32 words): two
		erasure.TextSample(numbered(10, " ")), // 1: never probed
	})
	if diff := cmp.Diff([]int32{0, 0, 1, 1, 1, 2, 2, 2, 2}, set.passage); diff != "" {
		t.Errorf("passages: -want, +got:\n%s", diff)
	}
	if diff := cmp.Diff([]int32{2, 2, 2, 2, 2, 2, 2, 2, 2}, set.need); diff != "" {
		t.Errorf("need: -want, +got:\n%s", diff)
	}
	if set.shortest != len(numbered(8, " ")) {
		t.Errorf("shortest = %d, want %d", set.shortest, len(numbered(8, " ")))
	}
}

// TestTextSampleNeverPrints: a sample formatted by mistake prints no text.
func TestTextSampleNeverPrints(t *testing.T) {
	s := []erasure.TextSample{"the erased secret"}
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		if got := fmt.Sprintf(f, s); strings.Contains(got, "secret") || strings.Contains(got, fmt.Sprintf("%x", "secret")) {
			t.Errorf("%s prints the sample: %s", f, got)
		}
	}
}
