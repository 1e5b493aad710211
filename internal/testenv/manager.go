package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// BuildManager compiles cmd/manager into dir and returns the binary's path:
// tests that must kill the manager for real (SIGKILL at any instruction, not
// at a hook) or measure its own memory run it as its own process.
func BuildManager(dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "lethe-manager")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/manager")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/manager: %w\n%s", err, out)
	}
	return bin, nil
}

// WriteKubeconfig writes a kubeconfig for an administrator of the control
// plane to dir and returns its path.
func (c *ControlPlane) WriteKubeconfig(dir string) (string, error) {
	user, err := c.Env.AddUser(envtest.User{Name: "lethe-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("add a control plane user: %w", err)
	}
	raw, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, raw, 0o600)
}

// ManagerProcess is a running cmd/manager, signalled by its own PID.
type ManagerProcess struct {
	cmd     *exec.Cmd
	done    chan struct{}
	mu      sync.Mutex
	exitErr error
}

// StartManager runs the binary with args, KUBECONFIG set to kubeconfig, and
// its output appended to logPath. It returns once the process has started;
// the manager's own readiness shows in the objects it reconciles.
func StartManager(bin, kubeconfig, logPath string, args ...string) (*ManagerProcess, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The manager dies with the test binary if the test never stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	m := &ManagerProcess{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		m.mu.Lock()
		m.exitErr = err
		m.mu.Unlock()
		close(m.done)
	}()
	return m, nil
}

// PID is the manager's process ID.
func (m *ManagerProcess) PID() int { return m.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (m *ManagerProcess) Exited() (bool, error) {
	select {
	case <-m.done:
		m.mu.Lock()
		defer m.mu.Unlock()
		return true, m.exitErr
	default:
		return false, nil
	}
}

// Kill ends the manager with SIGKILL, as an OOM kill or a node loss would:
// no deferred function, no graceful shutdown.
func (m *ManagerProcess) Kill() {
	if done, _ := m.Exited(); done {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.done
}

// Stop asks the manager to shut down (SIGTERM) and kills it after grace.
func (m *ManagerProcess) Stop(grace time.Duration) {
	if done, _ := m.Exited(); done {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(grace):
		m.Kill()
	}
}

// RSS is the manager's resident set size in bytes, from /proc.
func (m *ManagerProcess) RSS() (uint64, error) {
	return ProcessRSS(m.PID())
}

// ProcessRSS reads VmRSS of a process from /proc/PID/status.
func ProcessRSS(pid int) (uint64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
