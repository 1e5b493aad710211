// Package postgres is Lethe's adapter to the memory database: connections,
// the embedded migrations, the schema audit and the erasure ledger
// (*Eraser implements erasure.Ledger). SQL lives next to the code that runs
// it: fixed statements as named constants, per-table statements from small
// builders shared by every step that runs them (statements.go).
// Identifiers are quoted with pgx.Identifier; values are always parameters.
//
// By job: connect.go and pools.go open connections; migrate.go applies the
// migrations; audit.go audits a schema; layout.go discovers what an erasure
// must reach; db.go is the DB contract; eraser.go the Eraser; ledger.go the
// plan, tombstones, grace, cancel and ledger reads; receipts.go the
// receipts; delete.go, verify.go, probe.go and reerase.go the deletion and
// its checks; replicas.go the replicas; graphsource.go the graph sweep's
// source of provenance.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	pgxvec "github.com/pgvector/pgvector-go/pgx"
)

// Options tune a connection pool.
type Options struct {
	// MaxConns bounds the pool; 0 keeps pgx's default.
	MaxConns int32
	// Vector registers pgvector's types on every connection where the
	// vector extension exists.
	Vector bool
	// ApplicationName shows up in pg_stat_activity.
	ApplicationName string
	// VacuumGap is the least time between the end of a store's
	// post-deletion vacuum and the start of its next (vacuumQueue); 0: none.
	VacuumGap time.Duration
}

// unloggedValues are the settings every manager session starts with so
// that the samples of erased data its checks send as parameters stay out
// of the server's log when a statement fails, and out of the parse and plan
// trees a debugging setting would log. Any role may set these
// (log_parameter_max_length needs a superuser: paramlog.go); a server
// older than 13 refuses the connection over the first.
var unloggedValues = map[string]string{
	"log_parameter_max_length_on_error": "0",
	"debug_print_parse":                 "off",
	"debug_print_rewritten":             "off",
	"debug_print_plan":                  "off",
}

// ErrInvalidDSN is a DSN pgx cannot parse (a configuration mistake).
var ErrInvalidDSN = errors.New("invalid postgres DSN: it must be a URL or key=value string that pgx can parse")

// Connect opens a pool to dsn and checks that the server answers.
func Connect(ctx context.Context, dsn string, opts Options) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors can echo the DSN, password included; do not wrap them.
		return nil, ErrInvalidDSN
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	name := opts.ApplicationName
	if name == "" {
		name = "lethe"
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	// An erasure, its ledger rows and its receipt are durable when the
	// commit returns, whatever the server's default: a receipt lost in a
	// crash would be evidence of nothing, and the WAL position read after
	// the commit must cover it for the replica checks.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	for name, v := range unloggedValues {
		cfg.ConnConfig.RuntimeParams[name] = v
	}
	// Lethe's statements filter on arrays of IDs (= ANY($1)). A named prepared
	// statement switches to a generic plan after five runs, which guesses the
	// array's size and picked sequential scans (the sixth and later deletion
	// batches ran ten times slower). Unnamed statements are planned with the
	// actual values each time; the cascade's own cached plans are untouched
	// (plan_cache_mode=force_custom_plan would re-plan those for every row).
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	if opts.Vector {
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			var present bool
			if err := conn.QueryRow(ctx, `SELECT to_regtype('vector') IS NOT NULL`).Scan(&present); err != nil || !present {
				return err
			}
			return pgxvec.RegisterTypes(ctx, conn)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres %s:%d does not answer: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}
