// Package auditref recomputes a request's evidence digests the way an
// auditor's own script would, from the request's JSON alone, following
// docs/evidence-format.md. It is a second, hand-written implementation of
// RFC 8785 for the JSON the format uses (objects, arrays, strings,
// integers, booleans, null) and shares no code with package evidence, so
// tests can hold the two against each other.
package auditref

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"unicode/utf16"
)

// Format is the evidence format this recomputes.
const Format = "lethe.dev/evidence/v1"

// Canonicalize writes v (as decoded by encoding/json with UseNumber) in
// RFC 8785 form.
func Canonicalize(buf *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(x))
	case string:
		writeString(buf, x)
	case json.Number:
		f, err := x.Float64()
		if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return fmt.Errorf("number %s: only integers below 2^53 occur in the format", x)
		}
		buf.WriteString(strconv.FormatInt(int64(f), 10))
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := Canonicalize(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		return writeObject(buf, x)
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}

// writeObject sorts the members by their names' UTF-16 code units.
func writeObject(buf *bytes.Buffer, m map[string]any) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return utf16Less(keys[i], keys[j]) })
	buf.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		writeString(buf, k)
		buf.WriteByte(':')
		if err := Canonicalize(buf, m[k]); err != nil {
			return err
		}
	}
	buf.WriteByte('}')
	return nil
}

func utf16Less(a, b string) bool {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}

// writeString escapes as ECMAScript's JSON.stringify does.
func writeString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(buf, `\u%04x`, r)
			} else {
				buf.WriteRune(r)
			}
		}
	}
	buf.WriteByte('"')
}

// Digest is "sha256:" and the hex sha256 of v's canonical form.
func Digest(v any) (string, error) {
	var buf bytes.Buffer
	if err := Canonicalize(&buf, v); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Result is what Recompute found.
type Result struct {
	// EntryDigests are the digests every history entry must carry.
	EntryDigests []string
	// EvidenceDigest is the digest of the request's evidence document as it
	// stands: the last entry's evidenceDigest must equal it.
	EvidenceDigest string
}

// Recompute reads an ErasureRequest's JSON (as the API serves it, or the
// request of a bundle) and recomputes its digests.
func Recompute(requestJSON []byte) (Result, error) {
	dec := json.NewDecoder(bytes.NewReader(requestJSON))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return Result{}, err
	}
	meta, spec, status := field(obj, "metadata"), field(obj, "spec"), field(obj, "status")
	uid, _ := meta["uid"].(string)
	if f, _ := status["evidenceFormat"].(string); f != Format {
		return Result{}, fmt.Errorf("evidence format %q, not %s", f, Format)
	}
	sessions, ok := spec["sessionIDs"].([]any)
	if !ok {
		sessions = []any{}
	}
	steps, ok := field(status, "evidence")["steps"].([]any)
	if !ok {
		steps = []any{}
	}
	doc := map[string]any{"format": Format, "request": uid, "store": field(spec, "storeRef")["name"],
		"sessionIDs": sessions, "plan": status["plan"], "steps": steps}
	var res Result
	var err error
	if res.EvidenceDigest, err = Digest(doc); err != nil {
		return res, err
	}
	history, _ := status["history"].([]any)
	for _, h := range history {
		e, _ := h.(map[string]any)
		entry := map[string]any{"format": Format, "request": uid}
		for _, k := range []string{"previousDigest", "phase", "event", "time", "evidenceDigest", "keyID"} {
			s, _ := e[k].(string)
			entry[k] = s
		}
		d, err := Digest(entry)
		if err != nil {
			return res, err
		}
		res.EntryDigests = append(res.EntryDigests, d)
	}
	return res, nil
}

func field(m map[string]any, k string) map[string]any {
	v, _ := m[k].(map[string]any)
	if v == nil {
		return map[string]any{}
	}
	return v
}
