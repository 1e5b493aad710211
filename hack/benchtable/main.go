// Command benchtable prints the table of `make bench`: the rows the
// benchmarks recorded (internal/benchreport), each with its median, its
// spread over the runs, its target and whether the target is met.
//
//	benchtable FILE
package main

import (
	"fmt"
	"os"

	"github.com/lethe-dev/lethe/internal/benchreport"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtable REPORT.jsonl")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
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
}
