// Package testenv starts the real services Lethe's tests run against — the
// Kubernetes control plane (kube-apiserver + etcd through envtest), a
// PostgreSQL cluster with pgvector, and FalkorDB on Valkey — each on a free
// loopback port in a temp folder, stopped by its own PID.
//
// The binaries are installed by `make test-deps` (which `make test` runs). When
// one is missing the start fails with the command to run; tests turn that into
// a failure, never a skip.
package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// RepoRoot finds the repository root (the folder holding go.mod) from the
// working directory, which `go test` sets to the package folder.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// envOr returns the environment variable, or def when it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// missing builds the error for a binary that is not installed.
func missing(what, path, target string) error {
	return fmt.Errorf("%s not found at %s: run `make %s` (or `make test`, which installs every test dependency)", what, path, target)
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// process is a started service, stopped by its own PID.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *SyncBuffer
	done chan struct{}
}

// SyncBuffer is a bytes.Buffer that one goroutine may read while others
// write (a service's output, a logger's lines).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the command with its output kept in memory for error reports.
// Pdeathsig stops the service if the test binary dies before Stop runs.
func start(name string, cmd *exec.Cmd, deathSig syscall.Signal) (*process, error) {
	out := &SyncBuffer{}
	cmd.Stdout = out
	cmd.Stderr = out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = deathSig
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: out, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop signals the process by PID and waits; it escalates to SIGKILL after grace.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitFor polls ready until it succeeds, the process exits, or timeout passes.
func (p *process) waitFor(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited during start-up:\n%s", p.name, p.log.String())
		}
		if last = ready(); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s: %w\n%s", p.name, timeout, last, p.log.String())
}

func itoa(i int) string { return strconv.Itoa(i) }
