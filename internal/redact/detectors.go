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
}

// Detectors, in the order they run: a later detector sees the placeholders
// of the earlier ones, never their values (the most specific first, so
// that a token is named for its provider, not as a generic secret).
var Detectors = []Detector{
	{Name: "private-key", Placeholder: "[secret:private-key]",
		Pattern: `-----BEGIN [A-Z ]*PRIVATE KEY-----[^-]*-----END [A-Z ]*PRIVATE KEY-----`},
	{Name: "jwt", Placeholder: "[secret:jwt]",
		Pattern: `\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}`},
	{Name: "aws-access-key", Placeholder: "[secret:aws]",
		Pattern: `\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`},
	{Name: "github-token", Placeholder: "[secret:github]",
		Pattern: `\b(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{60,90})\b`},
	{Name: "gitlab-token", Placeholder: "[secret:gitlab]",
		Pattern: `\bglpat-[A-Za-z0-9_-]{20,}`},
	{Name: "slack-token", Placeholder: "[secret:slack]",
		Pattern: `\bxox[abposr]-[A-Za-z0-9-]{10,}`},
	{Name: "api-key", Placeholder: "[secret:api-key]",
		Pattern: `\bsk-[A-Za-z0-9_-]{20,}`},
	{Name: "generic-secret", Placeholder: "[secret]", Check: CheckEntropy,
		Pattern: `(?i)\b(?:api[_-]?key|secret|token|password|passwd|pwd)["']?[ ]*[:=][ ]*["']?[A-Za-z0-9_/+=.!@#$%^&*-]{12,}`},
	{Name: "email", Placeholder: "[email]",
		Pattern: `\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b`},
	{Name: "iban", Placeholder: "[iban]", Check: CheckIBAN,
		Pattern: `\b[A-Z]{2}[0-9]{2}(?:[ ]?[A-Z0-9]){11,30}\b`},
	{Name: "card", Placeholder: "[card]", Check: CheckLuhn,
		Pattern: `\b[0-9](?:[ -]?[0-9]){12,18}\b`},
	{Name: "phone", Placeholder: "[phone]",
		Pattern: `(?:\+[1-9][0-9]{0,2}[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,4}(?:[ .-]?[0-9]{2,4}){1,4}\b|\([0-9]{3}\)[ ]?[0-9]{3}-[0-9]{4}\b|\b[0-9]{3}-[0-9]{3}-[0-9]{4}\b|\b0[0-9]{2,4}[ /-][0-9]{3,4}[ -]?[0-9]{3,4}\b)`},
	{Name: "ipv4", Placeholder: "[ip]", Check: CheckNotVersion,
		Pattern: `[-.]?\b(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\b`},
	{Name: "ipv6", Placeholder: "[ip]",
		Pattern: `\b(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}\b|\b(?:[0-9A-Fa-f]{1,4}:){1,6}:(?:[0-9A-Fa-f]{1,4}:){0,5}[0-9A-Fa-f]{1,4}\b`},
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
