// Package migrations embeds the goose SQL migrations: the reference memory
// schema (00001), the erasure-support objects Lethe needs in any memory
// database (00002), the wiring of the two (00003), the operator's role (00004),
// erased sources (00005) and their wiring (00006), late derivations (00007)
// and their wiring (00008), keyed content hashes and tenant-scoped content
// erasure with its reference wiring (00009), and the reference tables' own
// role with row-level security forced on them (00010), erasure proofs and
// the receipt log (00011, 00012), the batch guard of a deletion in one
// round trip (00013), and redaction at insert: the redactor generated from
// internal/redact (00014), its trigger on the reference schema's reasoning
// column (00015), and the redaction of rows written before it (00016); the
// whole registry replacing the batch guard's epoch (00017), and the layout
// a tombstone's content rows were written from (00018), and room on the
// ledger's pages for the deletion's updates (00019).
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
