package graph

import (
	"strings"
	"testing"
)

// FuzzParamsHeader: no input panics, and a string parameter can never end
// its literal early: inside the rendered literal every quote is escaped and
// every backslash starts an escape, so the query text after it is Lethe's.
func FuzzParamsHeader(f *testing.F) {
	for _, s := range []string{"", `"`, `\`, `\"`, `"}) DETACH DELETE n //`, "ünï\x01\u200b", "a\nb\tc\r", `\\"`} {
		f.Add(s, "k")
	}
	f.Fuzz(func(t *testing.T, value, key string) {
		h, err := paramsHeader(map[string]any{"s": value, "l": []any{value, int64(len(value))}, "m": map[string]any{"k": value}})
		if strings.IndexByte(value, 0) >= 0 {
			if err == nil {
				t.Fatal("a NUL byte was accepted")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		// Walk the header: outside literals only Lethe's own characters appear.
		in, esc, literals := false, false, 0
		for i := 0; i < len(h); i++ {
			c := h[i]
			switch {
			case esc:
				if !strings.ContainsRune(`"\nrt`, rune(c)) {
					t.Fatalf("unknown escape \\%c in %q", c, h)
				}
				esc = false
			case in && c == '\\':
				esc = true
			case c == '"':
				in = !in
				if in {
					literals++
				}
			}
		}
		if in || esc || literals != 3 {
			t.Fatalf("header %q: %d literals, unterminated=%v", h, literals, in)
		}
		if _, err := paramsHeader(map[string]any{key: 1}); err == nil && !identifier.MatchString(key) {
			t.Fatalf("key %q accepted", key)
		}
	})
}
