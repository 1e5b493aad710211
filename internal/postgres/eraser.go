package postgres

import (
	"context"
	"sync"
	"sync/atomic"

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

	// Memo is what the Erasers of this database schema share (Pools.Memo);
	// nil: the Eraser keeps its own.
	Memo *AuditMemo

	mu          sync.Mutex
	loaded      *Layout
	layoutEpoch string
	own         *AuditMemo
	ways        struct{ short, declined, long atomic.Int64 }
}

// BatchWays counts the deletion batches of an Eraser by the way they took
// (batchguard.go): Declined of them were refused by the short way's guard
// and then ran the long way, which Long counts too.
type BatchWays struct{ Short, Declined, Long int64 }

// Ways reports how the Eraser's batches ran so far.
func (e *Eraser) Ways() BatchWays {
	return BatchWays{Short: e.ways.short.Load(), Declined: e.ways.declined.Load(), Long: e.ways.long.Load()}
}

var _ erasure.Ledger = (*Eraser)(nil)

// memo is the shared memo, or the Eraser's own.
func (e *Eraser) memo() *AuditMemo {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.Memo != nil {
		return e.Memo
	}
	if e.own == nil {
		e.own = &AuditMemo{}
	}
	return e.own
}

// layout reads the database's layout once per Eraser (the catalog queries
// cost more than a small deletion) and reuses it for every transaction. A
// layout the memo holds is reused while the catalog epoch is the one it was
// read under.
//
// Inside a transaction q must be that transaction: taking a second
// connection while holding one deadlocks once every connection of the pool
// is held by a pass waiting for another (4 concurrent reconciles on a pool
// of 4 did, in P4).
func (e *Eraser) layout(ctx context.Context, q Querier) (Layout, error) {
	l, _, err := e.layoutAndEpoch(ctx, q)
	return l, err
}

// layoutAndEpoch is layout, with the catalog epoch the layout was read
// under ("" when not known: no epoch, or it changed during the read).
func (e *Eraser) layoutAndEpoch(ctx context.Context, q Querier) (Layout, string, error) {
	m := e.memo()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loaded != nil {
		return *e.loaded, e.layoutEpoch, nil
	}
	epoch := readEpoch(ctx, q)
	m.mu.Lock()
	m.forPool(e.Pool)
	if epoch != "" && m.layout != nil && m.layoutEpoch == epoch {
		e.loaded, e.layoutEpoch = m.layout, epoch
		m.mu.Unlock()
		return *e.loaded, epoch, nil
	}
	m.mu.Unlock()
	l, err := LoadLayout(ctx, q, e.Schema)
	if err != nil {
		return l, "", err
	}
	e.loaded, e.layoutEpoch = &l, ""
	if epoch != "" && readEpoch(ctx, q) == epoch {
		e.layoutEpoch = epoch
		m.mu.Lock()
		m.layout, m.layoutEpoch = &l, epoch
		m.mu.Unlock()
	}
	return l, e.layoutEpoch, nil
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
