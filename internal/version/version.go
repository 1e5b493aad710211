// Package version is the build information of Lethe's binaries. Release
// builds stamp it with the linker:
//
//	-X github.com/lethe-dev/lethe/internal/version.Version=v0.3.0
//	-X github.com/lethe-dev/lethe/internal/version.GitCommit=<sha>
//	-X github.com/lethe-dev/lethe/internal/version.BuildDate=<RFC 3339>
//
// An unstamped build (go build, go install) falls back to what the Go
// toolchain recorded in the binary (module version, VCS revision and time).
package version

import (
	"runtime"
	"runtime/debug"
)

// Set by -ldflags -X at build time; empty in an unstamped build.
var (
	Version   string
	GitCommit string
	BuildDate string
)

// Unknown is what a field says when neither the linker nor the toolchain set it.
const Unknown = "unknown"

// Info is a binary's build information.
type Info struct {
	Version   string `json:"version"`
	GitCommit string `json:"gitCommit"`
	BuildDate string `json:"buildDate"`
	// Modified is true when the build came from a work tree with uncommitted changes.
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns this binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(Version, GitCommit, BuildDate, bi)
}

// get is Get with its inputs passed in, so that the fallback can be tested.
func get(ver, commit, date string, bi *debug.BuildInfo) Info {
	info := Info{Version: ver, GitCommit: commit, BuildDate: date,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		fromBuildInfo(&info, bi)
	}
	for _, f := range []*string{&info.Version, &info.GitCommit, &info.BuildDate} {
		if *f == "" {
			*f = Unknown
		}
	}
	return info
}

// fromBuildInfo fills the fields the linker left empty from what the Go
// toolchain recorded: the module version, the VCS revision and time. The
// modified flag and the Go version always come from it.
func fromBuildInfo(info *Info, bi *debug.BuildInfo) {
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if info.GitCommit == "" {
				info.GitCommit = s.Value
			}
		case "vcs.time":
			if info.BuildDate == "" {
				info.BuildDate = s.Value
			}
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
}
