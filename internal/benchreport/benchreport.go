// Package benchreport gathers the figures of `make bench` into one table.
// Each benchmark records its rows — what is measured, with the data size and
// settings it was measured at, one value per run, and the target from
// docs/targets — into the file $LETHE_BENCH_REPORT (JSON lines; nothing is
// written when it is unset). hack/benchtable merges the runs of each row
// (`go test -count N` runs a benchmark N times) and prints the table with the
// spread and whether each target is met.
package benchreport

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// EnvFile names the report file.
const EnvFile = "LETHE_BENCH_REPORT"

// Row is one figure of the table.
type Row struct {
	// ID is the target's name in targets.md (P1…P6, R13).
	ID string `json:"id"`
	// Figure says what is measured.
	Figure string `json:"figure"`
	// Setting is the data size, batch size, QPS/burst and concurrency.
	Setting string `json:"setting"`
	// Unit of the values ("×" for a ratio to the baseline, "ms", "s", "MiB").
	Unit string `json:"unit"`
	// Runs holds one value per run.
	Runs []float64 `json:"runs"`
	// Target is the bound the median must keep (none when HasTarget is false).
	Target    float64 `json:"target,omitempty"`
	HasTarget bool    `json:"hasTarget,omitempty"`
	// AtLeast: the median must be at least Target (default: at most).
	AtLeast bool `json:"atLeast,omitempty"`
}

// key identifies a row across runs.
func (r Row) key() string { return r.ID + "\x00" + r.Figure + "\x00" + r.Setting }

var mu sync.Mutex

// Record logs the row on tb and appends it to the report file, if any.
func Record(tb testing.TB, r Row) {
	tb.Helper()
	tb.Logf("%s %s [%s]: %s", r.ID, r.Figure, r.Setting, r.summary())
	path := os.Getenv(EnvFile)
	if path == "" {
		return
	}
	line, err := json.Marshal(r)
	if err != nil {
		tb.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatalf("bench report: %v", err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Write(append(line, '\n')); err != nil {
		tb.Fatalf("bench report: %v", err)
	}
}

// Median of the runs (the mean of the middle two for an even count).
func (r Row) Median() float64 {
	if len(r.Runs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(r.Runs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// Met reports whether the median keeps the target (true without one).
func (r Row) Met() bool {
	switch {
	case !r.HasTarget:
		return true
	case r.AtLeast:
		return r.Median() >= r.Target
	default:
		return r.Median() <= r.Target
	}
}

// TargetText is the target as the table shows it.
func (r Row) TargetText() string {
	if !r.HasTarget {
		return "—"
	}
	op := "≤"
	if r.AtLeast {
		op = "≥"
	}
	return fmt.Sprintf("%s %s %s", op, num(r.Target), r.Unit)
}

// summary is the median, the spread and the verdict.
func (r Row) summary() string {
	s := fmt.Sprintf("median %s %s", num(r.Median()), r.Unit)
	if len(r.Runs) > 1 {
		lo, hi := slices.Min(r.Runs), slices.Max(r.Runs)
		s += fmt.Sprintf(" (%s–%s over %d runs)", num(lo), num(hi), len(r.Runs))
	} else {
		s += " (1 run)"
	}
	if r.HasTarget {
		verdict := "met"
		if !r.Met() {
			verdict = "NOT met"
		}
		s += fmt.Sprintf("; target %s: %s", r.TargetText(), verdict)
	}
	return s
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// Read reads a report, merging the runs of rows recorded more than once,
// in the order each row first appears.
func Read(r io.Reader) ([]Row, error) {
	var out []Row
	at := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var row Row
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if row.ID == "" || row.Figure == "" || len(row.Runs) == 0 {
			return nil, fmt.Errorf("line %d: a row needs an id, a figure and at least one run", n)
		}
		if i, ok := at[row.key()]; ok {
			out[i].Runs = append(out[i].Runs, row.Runs...)
			continue
		}
		at[row.key()] = len(out)
		out = append(out, row)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("the report holds no row: did the benchmarks run with " + EnvFile + " set?")
	}
	return out, nil
}

// Incomplete returns the rows with fewer than runs runs. Every benchmark
// records each of its rows once per run, so a row short of `go test -count`
// runs is a run that failed: go test reports a failure in a count after the
// first (--- FAIL) without failing the binary.
func Incomplete(rows []Row, runs int) []Row {
	var out []Row
	for _, r := range rows {
		if len(r.Runs) < runs {
			out = append(out, r)
		}
	}
	return out
}

// Table renders the rows as a Markdown table.
func Table(rows []Row) string {
	var b strings.Builder
	b.WriteString("| target | figure | data size and settings | median | spread (runs) | target | met |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		spread := fmt.Sprintf("%s–%s (%d)", num(slices.Min(r.Runs)), num(slices.Max(r.Runs)), len(r.Runs))
		met := "—"
		if r.HasTarget {
			met = "yes"
			if !r.Met() {
				met = "**no**"
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s %s | %s | %s | %s |\n", r.ID, r.Figure, r.Setting, num(r.Median()), r.Unit, spread, r.TargetText(), met)
	}
	return b.String()
}
