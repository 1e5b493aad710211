package redact

import (
	"cmp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PersonDetector is the name counts and conditions give the names
// dictionary, and PersonPlaceholder what replaces a name.
const (
	PersonDetector    = "person"
	PersonPlaceholder = "[person]"
)

// Names is a dictionary of names to redact (a store's lethe.redaction_names):
// matched case-insensitively as whole words, the longest first where
// several start at one place, as the database's \m(?:…)\M does.
type Names struct{ names []string }

// NewNames is the dictionary of names, lowercased, longest first.
func NewNames(names []string) *Names {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n = strings.ToLower(n); n != "" {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(utf8.RuneCountInString(b), utf8.RuneCountInString(a)), strings.Compare(a, b))
	})
	return &Names{names: slices.Compact(out)}
}

// TextWithNames is Text, then the names of the dictionary replaced by
// PersonPlaceholder (counted under PersonDetector); names may be nil.
func TextWithNames(s string, names *Names) (string, Counts) {
	s, counts := Text(s)
	if names == nil || len(names.names) == 0 {
		return s, counts
	}
	var b strings.Builder
	last, n := 0, 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if isWord(r) && (i == 0 || !isWord(lastRune(s[:i]))) {
			if end := names.matchAt(s, i); end > 0 {
				b.WriteString(s[last:i])
				b.WriteString(PersonPlaceholder)
				last, i = end, end
				n++
				continue
			}
		}
		i += size
	}
	if n == 0 {
		return s, counts
	}
	b.WriteString(s[last:])
	counts[PersonDetector] += n
	return b.String(), counts
}

// matchAt is the end of the longest name matching s at i as a whole word
// (the word ends there), 0 for none.
func (ns *Names) matchAt(s string, i int) int {
	for _, name := range ns.names {
		j, k := i, 0
		for k < len(name) && j < len(s) {
			r1, n1 := utf8.DecodeRuneInString(s[j:])
			r2, n2 := utf8.DecodeRuneInString(name[k:])
			if unicode.ToLower(r1) != r2 {
				break
			}
			j, k = j+n1, k+n2
		}
		if k == len(name) && isWord(lastRune(s[:j])) && (j == len(s) || !isWord(firstRune(s[j:]))) {
			return j
		}
	}
	return 0
}

// isWord is a word character for \m and \M: a letter, a digit or '_'.
func isWord(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func lastRune(s string) rune  { r, _ := utf8.DecodeLastRuneInString(s); return r }
func firstRune(s string) rune { r, _ := utf8.DecodeRuneInString(s); return r }
