package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// orphanHelperEnv makes the test binary a helper that starts a control
// plane, says so, and waits to be killed.
const orphanHelperEnv = "LETHE_TESTENV_ORPHAN_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(cpuHelperEnv) != "" {
		cpuHelper()
		os.Exit(0)
	}
	if os.Getenv(orphanHelperEnv) != "" {
		cp, err := StartControlPlane()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("ready %s %s\n", cp.Env.ControlPlane.Etcd.DataDir, cp.Env.ControlPlane.APIServer.CertDir)
		select {} // killed by the test, never stopped
	}
	os.Exit(m.Run())
}

// A test binary killed before it stops its control plane (go test's
// -timeout, a SIGKILL) leaves no kube-apiserver or etcd running and no
// folder of theirs behind: its watchdog stops them by PID.
func TestControlPlaneDoesNotOutliveAKilledTestBinary(t *testing.T) {
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), orphanHelperEnv+"=1")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = helper.Process.Kill(); _ = helper.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("the helper did not start a control plane: %q, %v", line, err)
	}
	folders := strings.Fields(strings.TrimPrefix(line, "ready "))
	servers, err := children(helper.Process.Pid, KubeAssets())
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 2 {
		t.Fatalf("the helper runs %d control plane processes (%v), want kube-apiserver and etcd", len(servers), servers)
	}
	for _, f := range folders {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("the control plane's folder %s: %v", f, err)
		}
	}

	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		for pid, p := range servers {
			if stillRunning(pid, p) {
				left = append(left, fmt.Sprintf("%s (PID %d)", filepath.Base(p.exe), pid))
			}
		}
		for _, f := range folders {
			if _, err := os.Stat(f); err == nil {
				left = append(left, f)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			// Stopped here by PID, so that a failure leaves nothing behind.
			for pid, p := range servers {
				if stillRunning(pid, p) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			for _, f := range folders {
				_ = os.RemoveAll(f)
			}
			t.Fatalf("30 s after the test binary was killed, still there: %v", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stillRunning tells whether the process p, seen as pid, still runs: the
// PID has p's start time (not a PID reused since) and is not a zombie
// waiting for whoever adopted it to reap it.
func stillRunning(pid int, p proc) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) >= 20 && fields[0] != "Z" && fields[19] == p.started
}
