package main

import (
	"bytes"
	"os"
	"testing"
)

// The committed migration is what the detectors generate: a detector
// changed without `make generate` fails here, not only in verify-gen.
func TestTheMigrationIsGeneratedFromTheDetectors(t *testing.T) {
	var b bytes.Buffer
	if err := migration.Execute(&b, data()); err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../../migrations/00014_redaction.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, b.Bytes()) {
		t.Fatal("migrations/00014_redaction.sql is not what internal/redact's detectors generate: run make generate")
	}
}
