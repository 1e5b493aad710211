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

// cpuHelperEnv makes the test binary a process that uses CPU time on
// command. It reads lines from stdin and answers each with "ok" (or "ok S"):
//   - "burn MS": use MS milliseconds of its own CPU;
//   - "spawn MS": start a child of its own that burns MS and exits, and reap it;
//   - "start": start a child of its own that stays, taking commands;
//   - "child CMD": send CMD to that child;
//   - "reap": end that child and reap it;
//   - "usage": answer with the CPU seconds it and its reaped children used;
//   - "exit".
const cpuHelperEnv = "LETHE_TESTENV_CPU_HELPER"

func cpuHelper() {
	var kept *cpuProc
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		verb, arg, _ := strings.Cut(in.Text(), " ")
		ms, _ := strconv.Atoi(arg)
		answer := "ok"
		var err error
		switch verb {
		case "burn":
			burn(time.Duration(ms) * time.Millisecond)
		case "spawn":
			c := exec.Command(os.Args[0])
			c.Env = append(os.Environ(), cpuHelperEnv+"=1")
			c.Stdin = strings.NewReader(fmt.Sprintf("burn %d\nexit\n", ms))
			err = c.Run()
		case "start":
			kept, err = startHelper(os.Args[0])
		case "child":
			err = kept.send(arg)
		case "reap":
			_ = kept.in.Close()
			err = kept.cmd.Wait()
		case "usage":
			answer = fmt.Sprintf("ok %.3f", (rusage(syscall.RUSAGE_SELF) + rusage(syscall.RUSAGE_CHILDREN)).Seconds())
		case "exit":
			fmt.Println("ok")
			return
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(answer)
	}
}

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// burn spins until this process has used d more of CPU time.
func burn(d time.Duration) {
	for end := rusage(syscall.RUSAGE_SELF) + d; rusage(syscall.RUSAGE_SELF) < end; {
		for i := 0; i < 1e5; i++ {
			_ = i * i
		}
	}
}

// cpuProc is a helper process.
type cpuProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startHelper(path string) (*cpuProc, error) {
	c := exec.Command(path)
	c.Env = append(os.Environ(), cpuHelperEnv+"=1")
	in, err := c.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	return &cpuProc{cmd: c, in: in, out: bufio.NewScanner(out)}, nil
}

// ask sends a command and returns its answer's value ("" for a bare "ok").
func (p *cpuProc) ask(cmd string) (string, error) {
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		return "", err
	}
	if !p.out.Scan() {
		err := p.out.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF // it exited
		}
		return "", fmt.Errorf("%s: the helper did not answer: %w", cmd, err)
	}
	v, ok := strings.CutPrefix(p.out.Text(), "ok")
	if !ok {
		return "", fmt.Errorf("%s: the helper answered %q", cmd, p.out.Text())
	}
	return strings.TrimSpace(v), nil
}

func (p *cpuProc) send(cmd string) error {
	_, err := p.ask(cmd)
	return err
}

// startCPUHelper starts a helper under the name name: /proc names a
// process after the file it was started from, so a link gives each helper
// a service of its own.
func startCPUHelper(t *testing.T, name string) *cpuProc {
	t.Helper()
	link := filepath.Join(t.TempDir(), name)
	if err := os.Symlink(os.Args[0], link); err != nil {
		t.Fatal(err)
	}
	p, err := startHelper(link)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.in.Close()
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	return p
}

func (p *cpuProc) do(t *testing.T, cmd string) {
	t.Helper()
	if err := p.send(cmd); err != nil {
		t.Fatal(err)
	}
}

// usage is the CPU seconds the helper says it and its reaped children used.
func (p *cpuProc) usage(t *testing.T) float64 {
	t.Helper()
	v, err := p.ask("usage")
	if err != nil {
		t.Fatal(err)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// The CPU time of the processes a test starts is counted under the child
// of the test it runs under, with what their own children used, and once
// only for a process that exits between two readings: a child of the test
// (its time moves to the test's reaped time) or one deeper down (to its
// parent's).
func TestCPUUsageCountsEveryProcessUnderThisOne(t *testing.T) {
	live := startCPUHelper(t, "cpu-live")
	spawner := startCPUHelper(t, "cpu-spawner")
	keeper := startCPUHelper(t, "cpu-keeper")
	exiting := startCPUHelper(t, "cpu-exiting")
	idle := startCPUHelper(t, "cpu-idle")
	for _, p := range []*cpuProc{live, spawner, keeper, exiting, idle} {
		p.do(t, "burn 0") // started and answering before the first reading
	}
	// Used before the first reading: not in the difference.
	live.do(t, "burn 150")
	exiting.do(t, "burn 150")
	keeper.do(t, "start")
	keeper.do(t, "child burn 150")
	usedBefore := map[string]float64{"cpu-live": live.usage(t), "cpu-spawner": spawner.usage(t), "cpu-idle": idle.usage(t)}

	before, err := ReadCPU()
	if err != nil {
		t.Fatal(err)
	}
	live.do(t, "burn 300")
	spawner.do(t, "spawn 200")     // a grandchild that starts and exits in between
	keeper.do(t, "child burn 250") // one that was there before, and exits
	keeper.do(t, "reap")
	exiting.do(t, "burn 250") // a child of the test that exits
	exiting.do(t, "exit")
	if err := exiting.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	used := map[string]float64{}
	for name, p := range map[string]*cpuProc{"cpu-live": live, "cpu-spawner": spawner, "cpu-idle": idle} {
		used[name] = p.usage(t) - usedBefore[name]
	}
	after, err := ReadCPU()
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	t.Logf("%s; machine %.0f%% busy on %d cores", d, 100*d.Busy(), d.Cores)

	// /proc counts in clock ticks of 10 ms, cut at each reading, for a
	// process's own time and for its reaped children's: up to 4 ticks.
	near := func(what string, got, want, slack float64) {
		t.Helper()
		if got < want-0.04 || got > want+slack {
			t.Errorf("%s: %.3f s, want %.3f s", what, got, want)
		}
	}
	for name, v := range used {
		near(name+" (as it measured itself)", d.Services[name], v, 0.04)
	}
	near("the live helper", d.Services["cpu-live"], 0.30, 0.05)
	near("the helper whose child started and exited", d.Services["cpu-spawner"], 0.20, 0.10)
	// What the kept child used before the first reading is not counted
	// again (nor taken off the test's reaped time).
	near("the helper whose child was there and exited", d.Services["cpu-keeper"], 0.25, 0.05)
	near("the helper that exited (reaped by this process)", d.ReapedChildren, 0.25, 0.05)
	if _, counted := d.Services["cpu-exiting"]; counted {
		t.Errorf("the exited helper is still counted as a service: %v", d.Services)
	}
	if d.Cores < 1 || d.MachineTotal <= 0 || d.MachineBusy < d.Services["cpu-live"]-0.02 || d.Busy() > 1 {
		t.Errorf("machine: %.2f busy of %.2f s on %d cores", d.MachineBusy, d.MachineTotal, d.Cores)
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
