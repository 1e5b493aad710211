// Package redact finds secrets and personal data in free text and replaces
// each value with a typed placeholder ("[email]", "[card]", …). Its
// detectors are the one definition of what Lethe redacts: the database's
// redaction trigger (migration 00014, generated from Detectors by
// cmd/genredact) runs the same expressions with the same checks, and a
// test holds the two to the same output on a corpus.
//
// Patterns are written in the subset of regular-expression syntax that
// Go's RE2 and PostgreSQL's advanced regular expressions read alike:
// bracket expressions without \S \D \W inside them, greedy quantifiers
// only, non-capturing groups only, no lookaround, and \b for a word
// boundary (written \y for PostgreSQL by SQLPattern).
package redact

import (
	"regexp"
	"strings"
)

// Check is a test a match must also pass, beyond its pattern.
type Check string

// Checks.
const (
	// CheckNone: the pattern alone decides.
	CheckNone Check = ""
	// CheckLuhn: the digits pass the Luhn checksum (payment cards).
	CheckLuhn Check = "luhn"
	// CheckIBAN: the ISO 13616 mod-97 checksum holds.
	CheckIBAN Check = "iban"
	// CheckEntropy: the value after the key and separator has at least
	// MinEntropyBits bits of Shannon entropy per character.
	CheckEntropy Check = "entropy"
	// CheckNotVersion: the match does not start with the '-' or '.' its
	// pattern lets it take from before the address, as in release-1.2.3.4
	// (a version, not an address).
	CheckNotVersion Check = "not-version"
)

// MinEntropyBits is the least entropy per character of a generic secret.
const MinEntropyBits = 3.0

// Detector is one kind of value redacted.
type Detector struct {
	// Name is the detector's name in counts and conditions ("email").
	Name string
	// Placeholder replaces each value found.
	Placeholder string
	// Pattern is the expression, in the shared subset (package comment).
	Pattern string
	// Check is what a match must also pass.
	Check Check
	// Needs lists lowercase literals of which the lowercased text must hold
	// one, and NeedsDigit a digit, before the pattern is tried: each a
	// necessary condition of any match, so that most text skips most
	// expressions (a test holds every match of the corpus to them).
	Needs      []string
	NeedsDigit bool
}

// Detectors, in the order they run: a later detector sees the placeholders
// of the earlier ones, never their values (the most specific first, so
// that a token is named for its provider, not as a generic secret).
var Detectors = []Detector{
	{Name: "private-key", Placeholder: "[secret:private-key]", Needs: []string{"private key"},
		// Up to the END line, anything without two dashes in a row (an
		// encrypted PEM's headers have single ones); with no END line (a
		// key cut short), the base64 lines that follow. The first
		// alternative, when it matches, is the longer: Go's first choice
		// and PostgreSQL's longest agree.
		Pattern: `-----BEGIN [A-Z ]*PRIVATE KEY-----(?:(?:[^-]|-[^-])*-----END [A-Z ]*PRIVATE KEY-----|[A-Za-z0-9+/=\r\n]*)`},
	{Name: "jwt", Placeholder: "[secret:jwt]", Needs: []string{"eyj"},
		Pattern: `\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}`},
	{Name: "aws-access-key", Placeholder: "[secret:aws]", Needs: []string{"akia", "asia"},
		Pattern: `\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`},
	{Name: "github-token", Placeholder: "[secret:github]", Needs: []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"},
		Pattern: `\b(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{60,90})\b`},
	{Name: "gitlab-token", Placeholder: "[secret:gitlab]", Needs: []string{"glpat-"},
		Pattern: `\bglpat-[A-Za-z0-9_-]{20,}`},
	{Name: "slack-token", Placeholder: "[secret:slack]", Needs: []string{"xox"},
		Pattern: `\bxox[abposr]-[A-Za-z0-9-]{10,}`},
	{Name: "api-key", Placeholder: "[secret:api-key]", Needs: []string{"sk-"},
		Pattern: `\bsk-[A-Za-z0-9_-]{20,}`},
	{Name: "generic-secret", Placeholder: "[secret]", Check: CheckEntropy, Needs: []string{"api", "secret", "token", "passw", "pwd"},
		Pattern: `(?i)\b(?:api[_-]?key|secret|token|password|passwd|pwd)["']?[ ]*[:=][ ]*["']?[A-Za-z0-9_/+=.!@#$%^&*-]{12,}`},
	{Name: "email", Placeholder: "[email]", Needs: []string{"@"},
		Pattern: `\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b`},
	{Name: "iban", Placeholder: "[iban]", Check: CheckIBAN, NeedsDigit: true,
		Pattern: `\b[A-Z]{2}[0-9]{2}(?:[ ]?[A-Z0-9]){11,30}\b`},
	{Name: "card", Placeholder: "[card]", Check: CheckLuhn, NeedsDigit: true,
		Pattern: `\b[0-9](?:[ -]?[0-9]){12,18}\b`},
	{Name: "phone", Placeholder: "[phone]", NeedsDigit: true,
		Pattern: `(?:\+[1-9][0-9]{0,2}[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,4}(?:[ .-]?[0-9]{2,4}){1,4}\b|\([0-9]{3}\)[ ]?[0-9]{3}-[0-9]{4}\b|\b[0-9]{3}-[0-9]{3}-[0-9]{4}\b|\b0[0-9]{2,4}[ /-][0-9]{3,4}[ -]?[0-9]{3,4}\b)`},
	{Name: "ipv4", Placeholder: "[ip]", Check: CheckNotVersion, NeedsDigit: true,
		Pattern: `[-.]?\b(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\b`},
	{Name: "ipv6", Placeholder: "[ip]", Needs: []string{":"},
		Pattern: `\b(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}\b|\b(?:[0-9A-Fa-f]{1,4}:){1,6}:(?:[0-9A-Fa-f]{1,4}:){0,5}[0-9A-Fa-f]{1,4}\b`},
}

// mayMatch says whether s passes the detector's Needs and NeedsDigit.
func (d Detector) mayMatch(s string) bool {
	if d.NeedsDigit && !strings.ContainsAny(s, "0123456789") {
		return false
	}
	if len(d.Needs) == 0 {
		return true
	}
	low := strings.ToLower(s)
	for _, n := range d.Needs {
		if strings.Contains(low, n) {
			return true
		}
	}
	return false
}

// SQLPattern is the detector's pattern as PostgreSQL reads it.
func (d Detector) SQLPattern() string { return strings.ReplaceAll(d.Pattern, `\b`, `\y`) }

// compiled holds the Go expressions, in Detectors' order.
var compiled = func() []*regexp.Regexp {
	out := make([]*regexp.Regexp, len(Detectors))
	for i, d := range Detectors {
		out[i] = regexp.MustCompile(d.Pattern)
	}
	return out
}()
