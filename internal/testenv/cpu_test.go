package testenv

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// cpuHelperEnv makes the test binary a process that burns CPU time on
// command: it reads lines from stdin — "burn MS" (use MS milliseconds of
// its own CPU), "spawn MS" (start a child of its own that burns MS and
// exits, and reap it), "exit" — and answers each with "ok".
const cpuHelperEnv = "LETHE_TESTENV_CPU_HELPER"

func cpuHelper() {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		verb, arg, _ := strings.Cut(in.Text(), " ")
		ms, _ := strconv.Atoi(arg)
		switch verb {
		case "burn":
			burn(time.Duration(ms) * time.Millisecond)
		case "spawn":
			c := exec.Command(os.Args[0])
			c.Env = append(os.Environ(), cpuHelperEnv+"=1")
			c.Stdin = strings.NewReader(fmt.Sprintf("burn %d\nexit\n", ms))
			if err := c.Run(); err != nil {
				fmt.Println("error:", err)
				os.Exit(1)
			}
		case "exit":
			fmt.Println("ok")
			return
		}
		fmt.Println("ok")
	}
}

// burn spins until this process has used d more of CPU time.
func burn(d time.Duration) {
	used := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for end := used() + d; used() < end; {
		for i := 0; i < 1e5; i++ {
			_ = i * i
		}
	}
}

// cpuProc is a helper process started under the name name.
type cpuProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startCPUHelper(t *testing.T, name string) *cpuProc {
	t.Helper()
	// /proc names a process after the file it was started from: a link
	// gives each helper a service name of its own.
	link := filepath.Join(t.TempDir(), name)
	if err := os.Symlink(os.Args[0], link); err != nil {
		t.Fatal(err)
	}
	c := exec.Command(link)
	c.Env = append(os.Environ(), cpuHelperEnv+"=1")
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	p := &cpuProc{cmd: c, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		_ = in.Close()
		if c.ProcessState == nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	return p
}

// do sends a command and waits for its answer.
func (p *cpuProc) do(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		t.Fatal(err)
	}
	if !p.out.Scan() || p.out.Text() != "ok" {
		t.Fatalf("%s: the helper answered %q (%v)", cmd, p.out.Text(), p.out.Err())
	}
}

// The CPU time of the processes a test starts is counted under the child
// it runs under, with what their own children used, and once only for a
// child that exits between two readings.
func TestCPUUsageCountsEveryProcessUnderThisOne(t *testing.T) {
	live := startCPUHelper(t, "cpu-live")
	parent := startCPUHelper(t, "cpu-parent")
	exiting := startCPUHelper(t, "cpu-exiting")
	startCPUHelper(t, "cpu-idle")
	// Used before the first reading: not in the difference.
	live.do(t, "burn 150")
	exiting.do(t, "burn 150")

	before, err := ReadCPU()
	if err != nil {
		t.Fatal(err)
	}
	live.do(t, "burn 300")
	parent.do(t, "spawn 200") // a grandchild's time, reaped by its parent
	exiting.do(t, "burn 250")
	exiting.do(t, "exit")
	if err := exiting.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	after, err := ReadCPU()
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	t.Logf("%s; machine %.0f%% busy on %d cores", d, 100*d.Busy(), d.Cores)

	// A tick is 10 ms; a helper uses a little to start and to answer.
	near := func(what string, got, want float64) {
		t.Helper()
		if got < want-0.02 || got > want+0.08 {
			t.Errorf("%s: %.2f s, want %.2f s", what, got, want)
		}
	}
	near("the live helper", d.Services["cpu-live"], 0.30)
	near("the helper whose child burned", d.Services["cpu-parent"], 0.20)
	near("the helper that exited (reaped by this process)", d.ReapedChildren, 0.25)
	if _, counted := d.Services["cpu-exiting"]; counted {
		t.Errorf("the exited helper is still counted as a service: %v", d.Services)
	}
	if v := d.Services["cpu-idle"]; v > 0.02 {
		t.Errorf("the idle helper used %.2f s", v)
	}
	if d.Cores < 1 || d.MachineTotal <= 0 || d.MachineBusy < d.Services["cpu-live"]-0.02 || d.Busy() > 1 {
		t.Errorf("machine: %.2f busy of %.2f s on %d cores", d.MachineBusy, d.MachineTotal, d.Cores)
	}
	want := d.Self + d.ReapedChildren + d.Services["cpu-live"] + d.Services["cpu-parent"] + d.Services["cpu-idle"]
	if got := d.Total(); got < want-1e-9 || got > want+1e-9 {
		t.Errorf("Total %.2f, want the sum %.2f", got, want)
	}
}

// A process counts under the child of this process it descends from, at
// any depth; this process itself and processes outside it do not count.
func TestServiceIsTheChildAProcessRunsUnder(t *testing.T) {
	const self = 100
	stats := map[int]procfs.ProcStat{
		1:   {PID: 1, PPID: 0, Comm: "init"},
		100: {PID: 100, PPID: 1, Comm: "history.test"},
		200: {PID: 200, PPID: 100, Comm: "postgres"},
		201: {PID: 201, PPID: 200, Comm: "postgres"},
		300: {PID: 300, PPID: 100, Comm: "velero"},
		301: {PID: 301, PPID: 300, Comm: "velero-plugin-f"},
		302: {PID: 302, PPID: 301, Comm: "sh"},
		400: {PID: 400, PPID: 1, Comm: "sshd"},
		500: {PID: 500, PPID: 501, Comm: "a"}, // a loop /proc cannot show, read mid-change
		501: {PID: 501, PPID: 500, Comm: "b"},
	}
	for pid, want := range map[int]string{200: "postgres", 201: "postgres", 300: "velero", 301: "velero", 302: "velero"} {
		if got, ok := serviceOf(pid, self, stats); !ok || got != want {
			t.Errorf("process %d: service %q (%v), want %q", pid, got, ok, want)
		}
	}
	for _, pid := range []int{1, 100, 400, 500, 999} {
		if got, ok := serviceOf(pid, self, stats); ok {
			t.Errorf("process %d counted under %q: it is not under this process", pid, got)
		}
	}
}
