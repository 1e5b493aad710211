package version

import (
	"runtime/debug"
	"testing"
)

func TestLinkerValuesWin(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Version: "v9.9.9"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "fromtoolchain"}, {Key: "vcs.time", Value: "2020-01-01T00:00:00Z"}}}
	got := get("v1.2.3", "abc123", "2026-11-01T10:00:00Z", bi)
	if got.Version != "v1.2.3" || got.GitCommit != "abc123" || got.BuildDate != "2026-11-01T10:00:00Z" {
		t.Fatalf("linker values not used: %+v", got)
	}
}

func TestFallsBackToTheToolchainsBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.4.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-10-01T08:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	got := get("", "", "", bi)
	want := Info{Version: "v0.4.0", GitCommit: "0123abcd", BuildDate: "2026-10-01T08:00:00Z", Modified: true, GoVersion: "go1.26.0", Platform: got.Platform}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestSaysUnknownWhenNothingIsRecorded(t *testing.T) {
	for _, bi := range []*debug.BuildInfo{nil, {Main: debug.Module{Version: "(devel)"}}} {
		got := get("", "", "", bi)
		if got.Version != Unknown || got.GitCommit != Unknown || got.BuildDate != Unknown || got.GoVersion == "" || got.Platform == "" {
			t.Fatalf("build info %v: got %+v", bi, got)
		}
	}
}
