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
	// EntryEvidenceDigests are the evidenceDigest every entry must carry,
	// from the parts it recorded.
	EntryEvidenceDigests []string
	// Parts are the digests of the evidence parts as they stand (plan and
	// each step): the last entry's evidenceParts must equal them.
	Parts map[string]string
	// EvidenceDigest is the digest of the evidence document as it stands:
	// the last entry's evidenceDigest must equal it.
	EvidenceDigest string
	// LogLeaf is the receipt log's leaf data for the whole history.
	LogLeaf string
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
	sessionsDigest, err := Digest(sessions)
	if err != nil {
		return Result{}, err
	}
	res := Result{}
	if res.Parts, err = partsOf(status); err != nil {
		return res, err
	}
	document := func(parts any) (string, error) {
		return Digest(map[string]any{"format": Format, "request": uid, "store": field(spec, "storeRef")["name"],
			"sessions": sessionsDigest, "parts": parts})
	}
	partsAny := map[string]any{}
	for k, v := range res.Parts {
		partsAny[k] = v
	}
	if res.EvidenceDigest, err = document(partsAny); err != nil {
		return res, err
	}
	history, _ := status["history"].([]any)
	for _, h := range history {
		e, _ := h.(map[string]any)
		parts, ok := e["evidenceParts"].(map[string]any)
		if !ok {
			parts = map[string]any{}
		}
		ed, err := document(parts)
		if err != nil {
			return res, err
		}
		d, err := entryDigest(uid, e)
		if err != nil {
			return res, err
		}
		res.EntryEvidenceDigests, res.EntryDigests = append(res.EntryEvidenceDigests, ed), append(res.EntryDigests, d)
	}
	if n := len(res.EntryDigests); n > 0 {
		var buf bytes.Buffer
		leaf := map[string]any{"format": Format, "request": uid, "historyHead": res.EntryDigests[n-1], "historyLength": json.Number(strconv.Itoa(n))}
		if err := Canonicalize(&buf, leaf); err != nil {
			return res, err
		}
		res.LogLeaf = buf.String()
	}
	return res, nil
}

// partsOf digests the plan and each step's evidence of a status.
func partsOf(status map[string]any) (map[string]string, error) {
	parts := map[string]string{}
	var err error
	if plan, ok := status["plan"]; ok && plan != nil {
		if parts["plan"], err = Digest(plan); err != nil {
			return nil, err
		}
	}
	steps, _ := field(status, "evidence")["steps"].([]any)
	for _, s := range steps {
		step, _ := s.(map[string]any)
		name, _ := step["step"].(string)
		if parts[name], err = Digest(s); err != nil {
			return nil, err
		}
	}
	return parts, nil
}

// entryDigest is the digest history entry e of request uid must carry.
func entryDigest(uid string, e map[string]any) (string, error) {
	entry := map[string]any{"format": Format, "request": uid}
	for _, k := range []string{"previousDigest", "phase", "event", "time", "evidenceDigest", "keyID"} {
		s, _ := e[k].(string)
		entry[k] = s
	}
	return Digest(entry)
}

func field(m map[string]any, k string) map[string]any {
	v, _ := m[k].(map[string]any)
	if v == nil {
		return map[string]any{}
	}
	return v
}
