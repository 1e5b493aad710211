package testenv

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"

	"github.com/prometheus/procfs"
)

// CPUUsage is the processor time used by this process and every process it
// started, their own children included, read from /proc. Two readings' Sub
// is what they used in between, by service: a service is a child of this
// process (kube-apiserver, postgres, velero) with everything under it (a
// postgres backend counts as postgres, a Velero plugin as velero).
//
// A child that exits is, once this process reaps it, counted in this
// process's reaped total and no longer under its service: a harness that
// kills and restarts a child (a manager) sees most of that child's time as
// ReapedChildren. A process that exits between two readings is counted
// once, with the time it had used by the first taken off. Not counted: a
// process whose parent exited before reaping it (the kernel moves it out
// from under this one; what it had used by the first reading is still
// taken off), and the part of a clock tick each reading cuts.
type CPUUsage struct {
	// Services is CPU seconds by service (the command name of the child of
	// this process it runs under, as /proc gives it: at most 15 bytes).
	Services map[string]float64
	// Self is this process's own CPU seconds; ReapedChildren those of the
	// children it started that exited and were reaped, with their own.
	Self, ReapedChildren float64
	// MachineBusy and MachineTotal are the seconds every core of the machine
	// spent busy (not idle, not waiting for I/O) and in all. Cores is how
	// many of them this process may use (runtime.GOMAXPROCS).
	MachineBusy, MachineTotal float64
	Cores                     int

	// live is each live descendant's service and CPU seconds (with its
	// reaped children), by PID and start time, and whether it is a child of
	// this process; for Sub.
	live map[procKey]liveProc
}

type procKey struct {
	pid   int
	start uint64
}

type liveProc struct {
	service string
	cpu     float64
	child   bool
}

// ReadCPU reads the CPU time of this process, of every process under it,
// and of the machine.
func ReadCPU() (CPUUsage, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return CPUUsage{}, fmt.Errorf("open /proc: %w", err)
	}
	self := os.Getpid()
	stats, err := walkProcesses(fs, self)
	if err != nil {
		return CPUUsage{}, err
	}
	me, ok := stats[self]
	if !ok {
		return CPUUsage{}, fmt.Errorf("this process (%d) is not in /proc", self)
	}
	u := CPUUsage{Services: map[string]float64{}, live: map[procKey]liveProc{},
		Self: ticks(int64(me.UTime + me.STime)), ReapedChildren: ticks(int64(me.CUTime + me.CSTime))}
	for pid, s := range stats {
		service, under := serviceOf(pid, self, stats)
		if !under {
			continue
		}
		// A live process's reaped children are its own: a postgres
		// backend that exited is in the postmaster's.
		cpu := ticks(int64(s.UTime+s.STime)) + ticks(int64(s.CUTime+s.CSTime))
		u.Services[service] += cpu
		u.live[procKey{pid, s.Starttime}] = liveProc{service: service, cpu: cpu, child: s.PPID == self}
	}
	st, err := fs.Stat()
	if err != nil {
		return CPUUsage{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	c := st.CPUTotal
	u.MachineTotal = c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal
	u.MachineBusy = u.MachineTotal - c.Idle - c.Iowait
	// The cores this process may use (its affinity and CPU quota), not
	// every core of the host.
	u.Cores = runtime.GOMAXPROCS(0)
	return u, nil
}

// walkProcesses reads the stat of every process. /proc is read one process
// at a time: a process reaped between its parent's reading and its own is
// in neither, and one reaped between its own reading and its parent's is
// in both. So the walk is repeated (three more times at most) until no
// process under self (self included) exited or reaped a child during it.
func walkProcesses(fs procfs.FS, self int) (map[int]procfs.ProcStat, error) {
	for attempt := 0; ; attempt++ {
		procs, err := fs.AllProcs()
		if err != nil {
			return nil, fmt.Errorf("list /proc: %w", err)
		}
		stats := map[int]procfs.ProcStat{}
		for _, p := range procs {
			if s, err := p.Stat(); err == nil {
				stats[p.PID] = s
			}
		}
		if attempt == 3 || unchangedSince(fs, self, stats) {
			return stats, nil
		}
	}
}

// unchangedSince says whether every process under self, and self, is
// still there with the reaped time it had in stats.
func unchangedSince(fs procfs.FS, self int, stats map[int]procfs.ProcStat) bool {
	for pid, was := range stats {
		if _, under := serviceOf(pid, self, stats); !under && pid != self {
			continue
		}
		p, err := fs.Proc(pid)
		if err != nil {
			return false
		}
		now, err := p.Stat()
		if err != nil || now.Starttime != was.Starttime || now.CUTime+now.CSTime != was.CUTime+was.CSTime {
			return false
		}
	}
	return true
}

// ticks converts clock ticks to seconds: /proc counts in USER_HZ, which
// Linux fixes at 100 for user space whatever the kernel's own rate.
func ticks(n int64) float64 { return float64(n) / 100 }

// serviceOf is the command name of the child of self that pid runs under,
// and whether it runs under self at all (self itself does not).
func serviceOf(pid, self int, stats map[int]procfs.ProcStat) (string, bool) {
	for seen := 0; seen < len(stats); seen++ {
		s, ok := stats[pid]
		if !ok || pid == self {
			return "", false
		}
		if s.PPID == self {
			return s.Comm, true
		}
		pid = s.PPID
	}
	return "", false
}

// Sub is what u used beyond before.
func (u CPUUsage) Sub(before CPUUsage) CPUUsage {
	out := CPUUsage{Services: map[string]float64{}, Cores: u.Cores,
		Self:           u.Self - before.Self,
		ReapedChildren: u.ReapedChildren - before.ReapedChildren,
		MachineBusy:    u.MachineBusy - before.MachineBusy, MachineTotal: u.MachineTotal - before.MachineTotal}
	for k, p := range u.live {
		out.Services[p.service] += p.cpu - before.live[k].cpu
	}
	for k, p := range before.live {
		if _, still := u.live[k]; still {
			continue
		}
		// It exited: all of its time is now in its parent's reaped time,
		// this process's (a child) or its service's (deeper down). What it
		// had used by before is taken off there.
		if p.child {
			out.ReapedChildren -= p.cpu
		} else {
			out.Services[p.service] -= p.cpu
		}
	}
	return out
}

// Total is the CPU seconds this process and everything under it used.
func (u CPUUsage) Total() float64 {
	t := u.Self + u.ReapedChildren
	for _, v := range u.Services {
		t += v
	}
	return t
}

// Busy is the share of the machine's processor time that was busy.
func (u CPUUsage) Busy() float64 {
	if u.MachineTotal <= 0 {
		return 0
	}
	return u.MachineBusy / u.MachineTotal
}

// String names the services by CPU seconds, largest first, then this
// process and its reaped children.
func (u CPUUsage) String() string {
	names := make([]string, 0, len(u.Services))
	for n, v := range u.Services {
		// Below zero: a service whose processes all exited, their parents
		// first (their time is elsewhere or gone; Sub says which).
		if v > 0 {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		if u.Services[names[i]] != u.Services[names[j]] {
			return u.Services[names[i]] > u.Services[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, 0, len(names)+2)
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f s", n, u.Services[n]))
	}
	parts = append(parts, fmt.Sprintf("the test process %.1f s", u.Self), fmt.Sprintf("its exited children %.1f s", u.ReapedChildren))
	return strings.Join(parts, ", ")
}
