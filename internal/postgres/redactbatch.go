package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/redact"
)

// Backfill is what a redaction of pre-existing rows did (or, dry, would do)
// to one column.
type Backfill struct {
	Column string
	// Pages of the table walked, in Batches calls of lethe.redact_batch.
	Pages, Batches int64
	// RowsRead have a value; RowsChanged had a value to redact.
	RowsRead, RowsChanged int64
	// Counts are the values found per detector.
	Counts redact.Counts
}

// RedactColumn walks the pages the table of column ("schema.table.column")
// has when it starts, pagesPerBatch at a time, with lethe.redact_batch
// (00016): each batch its own transaction, with its receipt. Dry, each
// batch runs in a read-only transaction and changes nothing. progress, if
// not nil, sees the running totals after each batch.
func RedactColumn(ctx context.Context, db DB, column string, pagesPerBatch int64, dryRun bool, progress func(Backfill)) (Backfill, error) {
	b := Backfill{Column: column, Counts: redact.Counts{}}
	parts := strings.Split(column, ".")
	if len(parts) != 3 {
		return b, fmt.Errorf("column %q is not schema.table.column", column)
	}
	if pagesPerBatch < 1 || pagesPerBatch > 100000 {
		return b, fmt.Errorf("pages per batch %d out of bounds (1 to 100000)", pagesPerBatch)
	}
	table := pgx.Identifier{parts[0], parts[1]}.Sanitize()
	if err := db.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint`, table).Scan(&b.Pages); err != nil {
		return b, fmt.Errorf("size of %s: %w", table, err)
	}
	access := pgx.ReadWrite
	if dryRun {
		access = pgx.ReadOnly
	}
	for first := int64(0); first < b.Pages; first += pagesPerBatch {
		var read, changed int64
		var counts []byte
		err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: access}, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT rows_read, rows_changed, counts FROM lethe.redact_batch($1::regclass, $2, $3, $4, $5)`,
				table, parts[2], first, pagesPerBatch, dryRun).Scan(&read, &changed, &counts)
		})
		if err != nil {
			return b, fmt.Errorf("redact %s, pages %d to %d: %w", column, first, first+pagesPerBatch-1, err)
		}
		var found map[string]int
		if err := json.Unmarshal(counts, &found); err != nil {
			return b, err
		}
		b.Batches++
		b.RowsRead += read
		b.RowsChanged += changed
		for k, n := range found {
			b.Counts[k] += n
		}
		if progress != nil {
			progress(b)
		}
	}
	return b, nil
}
