package redact

import (
	"math"
	"math/big"
	"regexp"
	"strings"
)

// Counts is how many values each detector replaced, by detector name.
type Counts map[string]int

// Total is the sum of the counts.
func (c Counts) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// Text returns s with every value the detectors find replaced by their
// placeholders, in Detectors' order, and how many each replaced.
func Text(s string) (string, Counts) {
	counts := Counts{}
	for i, d := range Detectors {
		if !d.mayMatch(s) {
			continue
		}
		s = compiled[i].ReplaceAllStringFunc(s, func(m string) string {
			if !d.Check.passes(m) {
				return m
			}
			counts[d.Name]++
			return d.Placeholder
		})
	}
	return s, counts
}

// passes says whether the match m passes the check.
func (c Check) passes(m string) bool {
	switch c {
	case CheckLuhn:
		return wholeOrBeforeASeparator(m, func(p string) bool { return luhn(digits(p)) })
	case CheckIBAN:
		return wholeOrBeforeASeparator(m, func(p string) bool { return iban(strings.ReplaceAll(p, " ", "")) })
	case CheckEntropy:
		return entropy(secretValue(m)) >= MinEntropyBits
	case CheckNotVersion:
		return !strings.HasPrefix(m, "-") && !strings.HasPrefix(m, ".")
	}
	return true
}

// wholeOrBeforeASeparator says whether m, or a part of it that ends before
// one of its spaces or dashes, passes check: the patterns run on into what
// follows a number in the same grouping (a card's security code or expiry
// month, a word in capitals after an IBAN), and the whole match then fails
// its checksum. The whole match is replaced, the part that follows too.
func wholeOrBeforeASeparator(m string, check func(string) bool) bool {
	if check(m) {
		return true
	}
	for i := len(m) - 1; i > 0; i-- {
		if (m[i] == ' ' || m[i] == '-') && check(m[:i]) {
			return true
		}
	}
	return false
}

// digits keeps the ASCII digits of s.
func digits(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
}

// luhn is the Luhn checksum of a 13- to 19-digit number.
func luhn(ds string) bool {
	if len(ds) < 13 || len(ds) > 19 {
		return false
	}
	sum := 0
	for i := range len(ds) {
		d := int(ds[len(ds)-1-i] - '0')
		if i%2 == 1 {
			if d *= 2; d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return sum%10 == 0
}

// iban is the ISO 13616 check: the first four characters moved to the
// end, letters as 10..35, the number mod 97 is 1.
func iban(s string) bool {
	if len(s) < 15 || len(s) > 34 {
		return false
	}
	var b strings.Builder
	for _, r := range s[4:] + s[:4] {
		switch {
		case r >= '0' && r <= '9':
			b.WriteRune(r)
		case r >= 'A' && r <= 'Z':
			b.WriteString(big.NewInt(int64(r - 'A' + 10)).String())
		default:
			return false
		}
	}
	n, ok := new(big.Int).SetString(b.String(), 10)
	return ok && new(big.Int).Mod(n, big.NewInt(97)).Int64() == 1
}

// secretSeparator splits a generic secret's key from its value.
var secretSeparator = regexp.MustCompile(`[:=][ ]*["']?`)

// secretValue is the value of a generic secret's match (after the key and
// separator).
func secretValue(m string) string {
	loc := secretSeparator.FindStringIndex(m)
	if loc == nil {
		return ""
	}
	return m[loc[1]:]
}

// entropy is the Shannon entropy of s in bits per character.
func entropy(s string) float64 {
	if s == "" {
		return 0
	}
	freq := map[rune]float64{}
	n := 0.0
	for _, r := range s {
		freq[r]++
		n++
	}
	h := 0.0
	for _, f := range freq {
		p := f / n
		h -= p * math.Log2(p)
	}
	return h
}
