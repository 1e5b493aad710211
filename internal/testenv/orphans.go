package testenv

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// envtest starts kube-apiserver and etcd without a death signal, so a test
// binary killed before it stops them (go test's -timeout, a SIGKILL) left
// them running, with their folders. A watchdog, one small shell per
// control plane, waits for the test binary to be gone (the end of a pipe
// only the binary holds reaches EOF) and then stops them by their PIDs and
// removes their folders; a control plane stopped by the test stops its
// watchdog first.

// watchdogScript waits for EOF on its standard input, then stops the
// processes named by the pairs "PID start-time" that follow, up to "--",
// and removes the folders after it. A PID is signalled only while its
// start time (field 22 of /proc/PID/stat) is the one recorded: never a
// PID reused since.
const watchdogScript = `while read -r _; do :; done
started() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
signal() {
	sig=$1; shift
	while [ "$1" != "--" ]; do
		[ "$(started "$1")" = "$2" ] && kill -"$sig" "$1" 2>/dev/null
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

// watchdog is a running watchdog process and the write end of its pipe.
type watchdog struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// alive holds the running watchdogs, and so their pipes' write ends, until
// they are stopped: only the test binary's death closes a running one (a
// finalizer would close an unreferenced one early).
var (
	aliveMu sync.Mutex
	alive   = map[*watchdog]struct{}{}
)

// watchChildren starts a watchdog over this process's children whose
// executable is in dir, except those in before, and over folders.
func watchChildren(dir string, before map[int]proc, folders []string) (*watchdog, error) {
	kids, err := children(os.Getpid(), dir)
	if err != nil {
		return nil, err
	}
	args := []string{"-c", watchdogScript, "watchdog"}
	for pid, p := range kids {
		if _, old := before[pid]; !old {
			args = append(args, strconv.Itoa(pid), p.started)
		}
	}
	if len(args) == 3 {
		return nil, fmt.Errorf("no new child process runs a binary from %s", dir)
	}
	args = append(append(args, "--"), folders...)
	cmd := exec.Command("/bin/sh", args...)
	// Its own process group: a Ctrl-C to the test does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the control plane's watchdog: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	w := &watchdog{cmd: cmd, stdin: stdin}
	aliveMu.Lock()
	alive[w] = struct{}{}
	aliveMu.Unlock()
	return w, nil
}

// stop ends the watchdog (the test stops the control plane itself) before
// it reads EOF, then closes its pipe.
func (w *watchdog) stop() {
	if w == nil {
		return
	}
	_ = w.cmd.Process.Kill()
	aliveMu.Lock()
	delete(alive, w)
	aliveMu.Unlock()
	_ = w.stdin.Close()
}

// proc is a child process: its executable and start time (clock ticks
// after boot, field 22 of /proc/PID/stat).
type proc struct{ exe, started string }

// children maps the PIDs of parent's children whose executable is in dir
// to what they run.
func children(parent int, dir string) (map[int]proc, error) {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... starttime (22nd): comm may hold spaces
		// and parentheses.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 20 || fields[1] != strconv.Itoa(parent) {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil {
			continue
		}
		if resolved, err := filepath.EvalSymlinks(filepath.Dir(exe)); err != nil || resolved != dir {
			continue
		}
		out[pid] = proc{exe: exe, started: fields[19]}
	}
	return out, nil
}
