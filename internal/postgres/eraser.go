package postgres

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// Eraser is the erasure ledger of one memory database: it runs the erasure
// steps of a request on it. Every method is safe to repeat: running it
// again after a crash anywhere gives the same end state, and a receipt is
// written once per (request, step, batch), in the transaction of the work
// it records.
type Eraser struct {
	Pool DB
	// Schema of the memory tables (e.g. "memory").
	Schema string
	// TenantID, when set, restricts every statement to sessions of that tenant.
	TenantID string
	// ProbeExclude names the schemas ("schema") and tables ("schema.table")
	// the residue probes skip.
	ProbeExclude []string

	mu     sync.Mutex
	loaded *Layout
}

var _ erasure.Ledger = (*Eraser)(nil)

// layout reads the database's layout once per Eraser (the catalog queries
// cost more than a small deletion) and reuses it for every transaction.
//
// Inside a transaction q must be that transaction: taking a second
// connection while holding one deadlocks once every connection of the pool
// is held by a pass waiting for another (4 concurrent reconciles on a pool
// of 4 did, in P4).
func (e *Eraser) layout(ctx context.Context, q Querier) (Layout, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loaded != nil {
		return *e.loaded, nil
	}
	l, err := LoadLayout(ctx, q, e.Schema)
	if err != nil {
		return l, err
	}
	e.loaded = &l
	return l, nil
}

// inTx runs fn in one transaction with the layout read in it.
func (e *Eraser) inTx(ctx context.Context, opts pgx.TxOptions, fn func(tx pgx.Tx, l Layout) error) error {
	return pgx.BeginTxFunc(ctx, e.Pool, opts, func(tx pgx.Tx) error {
		l, err := e.layout(ctx, tx)
		if err != nil {
			return err
		}
		return fn(tx, l)
	})
}

var readOnly = pgx.TxOptions{AccessMode: pgx.ReadOnly}

// tenant is the tenant parameter: NULL matches every tenant.
func (e *Eraser) tenant() *string {
	if e.TenantID == "" {
		return nil
	}
	return &e.TenantID
}

// sessions is the sessions table, for the statements that do not need the
// layout.
func (e *Eraser) sessions() Table { return Table{Schema: e.Schema, Name: "sessions"} }
