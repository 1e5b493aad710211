// Package redacttest generates the redactor's regression corpus:
// synthetic reasoning traces (no real personal data: every value is drawn
// from a seeded generator) with each detector's positives planted among
// look-alike negatives, and what each trace holds.
package redacttest

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
)

// Planted is one value planted in a trace.
type Planted struct {
	// Detector that must replace it; "" for a negative, which must stay.
	Detector string
	// Kind names a negative's look-alike class ("order number failing Luhn").
	Kind  string
	Value string
}

// Trace is one synthetic reasoning trace and what it holds.
type Trace struct {
	Text    string
	Planted []Planted
}

// Corpus is n traces from seed.
func Corpus(seed uint64, n int) []Trace {
	g := &gen{r: rand.New(rand.NewPCG(seed, 0x4ed))}
	out := make([]Trace, n)
	for i := range out {
		out[i] = g.trace()
	}
	return out
}

type gen struct{ r *rand.Rand }

// frames are sentences of reasoning with one slot each.
var frames = []string{
	"The user mentioned %s earlier, so I should keep that in mind.",
	"Let me check whether %s is relevant to the question.",
	"They pasted %s into the chat; I will not repeat it.",
	"Okay, so the config has %s and the rest looks fine.",
	"Hmm, %s — that looks like it came from their notes.",
	"I think the answer depends on %s here.",
	"(%s)",
	"Step 3: compare %s with what the docs say.",
}

func (g *gen) trace() Trace {
	var t Trace
	var parts []string
	for range 2 + g.r.IntN(5) {
		var p Planted
		if g.r.IntN(2) == 0 {
			p = g.positive()
		} else {
			p = g.negative()
		}
		t.Planted = append(t.Planted, p)
		parts = append(parts, fmt.Sprintf(frames[g.r.IntN(len(frames))], p.Value))
	}
	t.Text = strings.Join(parts, " ")
	return t
}

const (
	alnum  = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	upper  = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b64url = alnum + "-_"
	hexd   = "0123456789abcdef"
)

func (g *gen) pick(set string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = set[g.r.IntN(len(set))]
	}
	return string(b)
}

func (g *gen) digits(n int) string { return g.pick("0123456789", n) }

// Positives: one generator per detector, each drawing from the formats the
// detector documents.
var positives = []struct {
	detector string
	gen      func(g *gen) string
}{
	{"email", func(g *gen) string {
		return strings.ToLower(g.pick(alnum, 3+g.r.IntN(6))) + []string{".", "_", "+", ""}[g.r.IntN(4)] + strings.ToLower(g.pick(alnum, 2+g.r.IntN(4))) +
			"@" + strings.ToLower(g.pick(alnum, 4+g.r.IntN(6))) + []string{".com", ".org", ".co.uk", ".example", ".de"}[g.r.IntN(5)]
	}},
	{"phone", func(g *gen) string {
		switch g.r.IntN(5) {
		case 0:
			return "+44 20 " + g.digits(4) + " " + g.digits(4)
		case 1:
			return "+1-" + g.digits(3) + "-555-" + g.digits(4)
		case 2:
			return "(" + g.digits(3) + ") 555-" + g.digits(4)
		case 3:
			return "+49 30 " + g.digits(8)
		default:
			return "0" + g.digits(2) + " " + g.digits(4) + " " + g.digits(4)
		}
	}},
	{"card", func(g *gen) string {
		n := luhnComplete("4" + g.digits(14))
		grouped := n[:4] + " " + n[4:8] + " " + n[8:12] + " " + n[12:]
		switch g.r.IntN(5) {
		case 0:
			return n
		case 1:
			return grouped
		case 2:
			// followed by its security code, in the same grouping
			return grouped + " " + g.digits(3)
		case 3:
			// followed by its expiry date
			return grouped + " 0" + g.digits(1) + "/2" + g.digits(1)
		default:
			return n[:4] + "-" + n[4:8] + "-" + n[8:12] + "-" + n[12:]
		}
	}},
	{"iban", func(g *gen) string {
		country := []string{"DE", "GB", "FR", "NL"}[g.r.IntN(4)]
		bban := g.digits(18)
		if country == "GB" || country == "NL" {
			bban = g.pick("ABCDEFGHIJKLMNOPQRSTUVWXYZ", 4) + g.digits(14)
		}
		n := ibanComplete(country, bban)
		if g.r.IntN(3) > 0 {
			return n
		}
		// in groups of four, followed by a word in capitals
		var b strings.Builder
		for i := 0; i < len(n); i += 4 {
			b.WriteString(n[i:min(i+4, len(n))] + " ")
		}
		return b.String() + []string{"EUR", "BIC", "GBP"}[g.r.IntN(3)]
	}},
	{"github-token", func(g *gen) string { return "ghp_" + g.pick(alnum, 36) }},
	{"gitlab-token", func(g *gen) string { return "glpat-" + g.pick(b64url, 20) }},
	{"slack-token", func(g *gen) string { return "xoxb-" + g.digits(11) + "-" + g.digits(12) + "-" + g.pick(alnum, 24) }},
	{"api-key", func(g *gen) string { return "sk-" + []string{"", "proj-", "ant-"}[g.r.IntN(3)] + g.pick(b64url, 40) }},
	{"aws-access-key", func(g *gen) string { return "AKIA" + g.pick(upper, 16) }},
	{"jwt", func(g *gen) string {
		return "eyJhbGciOiJIUzI1NiJ9.eyJ" + g.pick(b64url, 30) + "." + g.pick(b64url, 43)
	}},
	{"private-key", func(g *gen) string {
		switch g.r.IntN(3) {
		case 0:
			// encrypted: headers with single dashes
			return "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC," + g.pick("0123456789ABCDEF", 32) +
				"\n\n" + g.pick(alnum+"+/", 64) + "\n-----END RSA PRIVATE KEY-----"
		case 1:
			// cut short: no END line
			return "-----BEGIN PRIVATE KEY-----\n" + g.pick(alnum+"+/", 64) + "\n" + g.pick(alnum+"+/", 20)
		default:
			return "-----BEGIN PRIVATE KEY-----\n" + g.pick(alnum+"+/", 64) + "\n" + g.pick(alnum+"+/", 40) + "=\n-----END PRIVATE KEY-----"
		}
	}},
	{"generic-secret", func(g *gen) string {
		return []string{"password", "api_key", "secret", "TOKEN"}[g.r.IntN(4)] + []string{"=", ": ", " = "}[g.r.IntN(3)] + g.pick(alnum+"!@#$%", 20)
	}},
	{"ipv4", func(g *gen) string {
		return fmt.Sprintf("%d.%d.%d.%d", 1+g.r.IntN(223), g.r.IntN(256), g.r.IntN(256), 1+g.r.IntN(254))
	}},
	{"ipv6", func(g *gen) string {
		return "2001:db8:" + g.pick(hexd, 4) + ":" + g.pick(hexd, 4) + "::" + g.pick(hexd, 3)
	}},
}

// Negatives: values that look like a detector's and are not.
var negatives = []struct {
	kind string
	gen  func(g *gen) string
}{
	{"order number failing Luhn", func(g *gen) string {
		n := luhnComplete("4" + g.digits(14))
		last := (int(n[15]-'0') + 1 + g.r.IntN(9)) % 10
		return "order " + n[:15] + string(rune('0'+last))
	}},
	{"IBAN-shaped reference failing mod 97", func(g *gen) string {
		s := ibanComplete("DE", g.digits(18))
		return s[:2] + fmt.Sprintf("%02d", (int(s[2]-'0')*10+int(s[3]-'0')+1+g.r.IntN(50))%100) + s[4:]
	}},
	{"version string", func(g *gen) string {
		return []string{"v", "go", "release-"}[g.r.IntN(3)] + fmt.Sprintf("%d.%d.%d.%d", g.r.IntN(3), g.r.IntN(30), g.r.IntN(10), g.r.IntN(100))
	}},
	{"semantic version", func(g *gen) string { return fmt.Sprintf("version %d.%d.%d", g.r.IntN(5), g.r.IntN(30), g.r.IntN(20)) }},
	{"UUID", func(g *gen) string {
		return g.pick(hexd, 8) + "-" + g.pick(hexd, 4) + "-4" + g.pick(hexd, 3) + "-a" + g.pick(hexd, 3) + "-" + g.pick(hexd, 12)
	}},
	{"sha256 digest", func(g *gen) string { return "sha256:" + g.pick(hexd, 64) }},
	{"date and time", func(g *gen) string {
		return fmt.Sprintf("2026-%02d-%02d %02d:%02d:%02d", 1+g.r.IntN(12), 1+g.r.IntN(28), g.r.IntN(24), g.r.IntN(60), g.r.IntN(60))
	}},
	{"price", func(g *gen) string {
		return fmt.Sprintf("$%d,%03d.%02d", 1+g.r.IntN(99), g.r.IntN(1000), g.r.IntN(100))
	}},
	{"short number", func(g *gen) string { return "ticket #" + g.digits(6) }},
	{"password mention without value", func(g *gen) string {
		return []string{"the password: reset it", "token = none yet", "secret: see the vault entry"}[g.r.IntN(3)]
	}},
	{"low-entropy assignment", func(g *gen) string { return "password=" + strings.Repeat("ab", 6+g.r.IntN(4)) }},
	{"sk- word", func(g *gen) string { return "risk-" + g.pick("abcdefghij", 8) }},
	{"email-like handle", func(g *gen) string { return "@" + strings.ToLower(g.pick(alnum, 8)) + " on the forum" }},
	{"file path", func(g *gen) string { return "/var/lib/app/" + strings.ToLower(g.pick(alnum, 10)) + ".conf" }},
}

func (g *gen) positive() Planted {
	p := positives[g.r.IntN(len(positives))]
	return Planted{Detector: p.detector, Value: p.gen(g)}
}

func (g *gen) negative() Planted {
	n := negatives[g.r.IntN(len(negatives))]
	return Planted{Kind: n.kind, Value: n.gen(g)}
}

// Detectors are the detectors the corpus plants positives of.
func Detectors() []string {
	out := make([]string, len(positives))
	for i, p := range positives {
		out[i] = p.detector
	}
	return out
}

// luhnComplete appends the Luhn check digit.
func luhnComplete(s string) string {
	sum := 0
	for i := range len(s) {
		d := int(s[len(s)-1-i] - '0')
		if i%2 == 0 {
			if d *= 2; d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return s + string(rune('0'+(10-sum%10)%10))
}

// ibanComplete computes an IBAN's check digits.
func ibanComplete(country, bban string) string {
	var b strings.Builder
	for _, r := range bban + country + "00" {
		if r >= 'A' && r <= 'Z' {
			fmt.Fprint(&b, int(r-'A'+10))
		} else {
			b.WriteRune(r)
		}
	}
	n, _ := new(big.Int).SetString(b.String(), 10)
	check := 98 - new(big.Int).Mod(n, big.NewInt(97)).Int64()
	return fmt.Sprintf("%s%02d%s", country, check, bban)
}
