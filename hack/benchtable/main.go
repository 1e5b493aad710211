// Command benchtable prints the table of `make bench`: the rows the
// benchmarks recorded (internal/benchreport), each with its median, its
// spread over the runs, its target and whether the target is met.
//
//	benchtable FILE
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/lethe-dev/lethe/internal/benchreport"
)

func main() {
	runs := flag.Int("runs", 1, "the runs every row must have (make bench's BENCH_COUNT)")
	flag.Parse()
	if flag.NArg() != 1 || *runs < 1 {
		fmt.Fprintln(os.Stderr, "usage: benchtable -runs N REPORT.jsonl (N at least 1)")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	defer func() { _ = f.Close() }()
	rows, err := benchreport.Read(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	fmt.Print(benchreport.Table(rows))
	if short := benchreport.Incomplete(rows, *runs); len(short) > 0 {
		for _, r := range short {
			fmt.Fprintf(os.Stderr, "benchtable: %s %q [%s] has %d of %d runs: a run of its benchmark failed (see --- FAIL above)\n",
				r.ID, r.Figure, r.Setting, len(r.Runs), *runs)
		}
		os.Exit(1)
	}
}
