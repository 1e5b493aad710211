package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// envtest starts kube-apiserver and etcd without a death signal, so a test
// binary killed before it stops them (go test's -timeout, a SIGKILL) left
// them running, with their folders. A watchdog, one small shell per
// control plane, waits for the test binary to be gone and then stops them
// by their PIDs and removes their folders; a control plane stopped by the
// test stops its watchdog first.

// watchdogScript polls the test binary ($1), then stops the processes
// named by the pairs "PID executable" that follow, up to "--", and removes
// the folders after it. A PID is signalled only while it still runs the
// executable it ran, never a PID reused since.
const watchdogScript = `parent=$1; shift
while kill -0 "$parent" 2>/dev/null; do sleep 1; done
signal() {
	sig=$1; shift
	while [ "$1" != "--" ]; do
		[ "$(readlink "/proc/$1/exe" 2>/dev/null)" = "$2" ] && kill -"$sig" "$1" 2>/dev/null
		shift 2
	done
}
signal TERM "$@"
sleep 5
signal KILL "$@"
while [ "$1" != "--" ]; do shift 2; done
shift
rm -rf -- "$@"
`

// watchdog is a running watchdog process.
type watchdog struct{ cmd *exec.Cmd }

// watchChildren starts a watchdog over this process's children whose
// executable is in dir, and over folders.
func watchChildren(dir string, folders []string) (*watchdog, error) {
	kids, err := children(os.Getpid(), dir)
	if err != nil {
		return nil, err
	}
	if len(kids) == 0 {
		return nil, fmt.Errorf("no child process runs a binary from %s", dir)
	}
	args := []string{"-c", watchdogScript, "watchdog", strconv.Itoa(os.Getpid())}
	for pid, exe := range kids {
		args = append(args, strconv.Itoa(pid), exe)
	}
	args = append(append(args, "--"), folders...)
	cmd := exec.Command("/bin/sh", args...)
	// Its own process group: a Ctrl-C to the test does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the control plane's watchdog: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	return &watchdog{cmd: cmd}, nil
}

// stop ends the watchdog (the test stops the control plane itself).
func (w *watchdog) stop() {
	if w != nil {
		_ = w.cmd.Process.Kill()
	}
}

// children maps the PIDs of parent's children whose executable is in dir
// to that executable.
func children(parent int, dir string) (map[int]string, error) {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		fields := strings.Fields(rest)
		if len(fields) < 2 || fields[1] != strconv.Itoa(parent) {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || filepath.Dir(exe) != dir {
			continue
		}
		out[pid] = exe
	}
	return out, nil
}
