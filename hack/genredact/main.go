// Command genredact writes the database's redactor (migration 00014) from
// the detectors of internal/redact, so that the Go and SQL redactors share
// one definition of each pattern. `make generate` runs it; verify-gen fails
// when the committed migration differs.
//
//	genredact FILE
package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"text/template"

	"github.com/lethe-dev/lethe/internal/redact"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: genredact FILE")
		os.Exit(2)
	}
	var b bytes.Buffer
	if err := migration.Execute(&b, data()); err != nil {
		fmt.Fprintln(os.Stderr, "genredact:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(os.Args[1], b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "genredact:", err)
		os.Exit(1)
	}
}

// templateData is what the migration is written from.
type templateData struct {
	Detectors                         []redact.Detector
	MinEntropyBits                    float64
	PersonDetector, PersonPlaceholder string
}

// data is the migration's data.
func data() templateData {
	return templateData{Detectors: redact.Detectors, MinEntropyBits: redact.MinEntropyBits,
		PersonDetector: redact.PersonDetector, PersonPlaceholder: redact.PersonPlaceholder}
}

// quote is a SQL string literal (standard_conforming_strings: backslashes
// are literal).
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

var migration = template.Must(template.New("00014").Funcs(template.FuncMap{"quote": quote}).Parse(sqlTemplate))
