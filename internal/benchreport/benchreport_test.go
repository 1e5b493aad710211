package benchreport_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/benchreport"
)

// Rows recorded by several runs merge into one with every run; the median,
// the spread and the verdict come from all of them.
func TestRunsMergeAndTargetsAreJudgedOnTheMedian(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.jsonl")
	t.Setenv(benchreport.EnvFile, path)
	p1 := func(v float64) benchreport.Row {
		return benchreport.Row{ID: "P1", Figure: "delete / raw", Setting: "60 sessions", Unit: "×", Runs: []float64{v}, Target: 1.10, HasTarget: true}
	}
	for _, v := range []float64{1.05, 1.30, 1.08} {
		benchreport.Record(t, p1(v))
	}
	benchreport.Record(t, benchreport.Row{ID: "P6", Figure: "recheck", Setting: "1,000 Backups", Unit: "s", Runs: []float64{0.6}})
	benchreport.Record(t, benchreport.Row{ID: "P3", Figure: "requests/s", Setting: "1,000", Unit: "/s", Runs: []float64{9, 11}, Target: 10, HasTarget: true, AtLeast: true})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	rows, err := benchreport.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || len(rows[0].Runs) != 3 || rows[0].Median() != 1.08 || !rows[0].Met() {
		t.Fatalf("P1 row %+v: want 3 runs, median 1.08, met", rows[0])
	}
	if rows[2].Median() != 10 || !rows[2].Met() {
		t.Fatalf("P3 row %+v: an at-least target met by its median", rows[2])
	}
	table := benchreport.Table(rows)
	for _, want := range []string{"| P1 | delete / raw | 60 sessions | 1.08 × | 1.05–1.30 (3) | ≤ 1.10 × | yes |", "| P6 | recheck | 1,000 Backups | 0.60 s | 0.60–0.60 (1) | — | — |", "≥ 10.0 /s"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	missed := p1(1.5)
	missed.Runs = []float64{1.5, 1.6}
	if missed.Met() || !strings.Contains(benchreport.Table([]benchreport.Row{missed}), "**no**") {
		t.Error("a median above its target reads as met")
	}
}

func TestReadRefusesRowsItCannotPlace(t *testing.T) {
	for name, in := range map[string]string{
		"empty":         "",
		"no runs":       `{"id":"P1","figure":"x","runs":[]}`,
		"unknown field": `{"id":"P1","figure":"x","runs":[1],"targt":2}`,
		"not json":      `P1 1.2`,
	} {
		if _, err := benchreport.Read(strings.NewReader(in)); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
}

// A row short of the runs asked for is reported: the run that did not
// record it failed.
func TestIncompleteNamesRowsShortOfTheRuns(t *testing.T) {
	rows := []benchreport.Row{
		{ID: "R13", Figure: "per run", Runs: []float64{2.2}},
		{ID: "P1", Figure: "ratio", Runs: []float64{1.5, 1.6, 1.7}},
	}
	short := benchreport.Incomplete(rows, 3)
	if len(short) != 1 || short[0].ID != "R13" {
		t.Fatalf("incomplete rows %+v, want only R13's", short)
	}
	if len(benchreport.Incomplete(rows, 1)) != 0 {
		t.Error("rows with every run reported incomplete")
	}
}
