package graph

import (
	"strings"
	"testing"
)

func TestParamsHeaderEscapesOnlyWhatFalkorDBReads(t *testing.T) {
	h, err := paramsHeader(map[string]any{
		"s":   "O\"Brien \\ x\ny\tz ünï \x01",
		"ids": []string{"a", "b"},
		"n":   3,
		"m":   []any{map[string]any{"k": int64(7), "z": nil}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `CYPHER ids=["a","b"] m=[{k:7,z:null}] n=3 s="O\"Brien \\ x\ny\tz ünï ` + "\x01" + `" `
	if h != want {
		t.Fatalf("header\n got %q\nwant %q", h, want)
	}
}

func TestParamsHeaderRefusesWhatCouldChangeAQuery(t *testing.T) {
	for name, p := range map[string]map[string]any{
		"key with space":     {"a b": 1},
		"key with brace":     {"a}": 1},
		"map key injection":  {"m": map[string]any{"k:1}) DETACH DELETE n //": 1}},
		"NUL byte":           {"s": "a\x00b"},
		"unsupported type":   {"u": uint8(1)},
		"unsupported nested": {"l": []any{struct{}{}}},
	} {
		if h, err := paramsHeader(p); err == nil {
			t.Errorf("%s: accepted as %q", name, h)
		}
	}
}

func TestQuoteNameRefusesAnythingButIdentifiers(t *testing.T) {
	for _, n := range []string{"Fact", "MENTIONS", "_x1"} {
		if q, err := quoteName(n); err != nil || q != "`"+n+"`" {
			t.Errorf("%q: %q %v", n, q, err)
		}
	}
	for _, n := range []string{"", "a`b", "a b", "x)-[r]-(y", "Ünï"} {
		if _, err := quoteName(n); err == nil || !strings.Contains(err.Error(), "plain identifier") {
			t.Errorf("%q: %v", n, err)
		}
	}
}
