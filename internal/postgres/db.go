package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier is the part of pgx that reads need: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DB is the connection pool an Eraser works through. *pgxpool.Pool
// satisfies it; a test may decorate one (say, a transaction whose Commit
// rolls back and fails, to crash a step inside its transaction).
//
// The contract an implementation keeps:
//   - Query, QueryRow and Exec run one statement outside any transaction,
//     on any connection, and are safe for concurrent use.
//   - BeginTx starts a transaction on a connection of its own, held until
//     the transaction ends. The Eraser never asks for a second connection
//     while it holds a transaction, so a pool of one connection suffices.
//   - A Commit that returns an error may or may not have committed: every
//     step of the Eraser is safe to repeat, and its caller repeats it.
//   - Connections use pgx.QueryExecModeExec (the Eraser's statements take
//     arrays of IDs and must be planned with their values) and have
//     pgvector's types registered where the vector extension exists:
//     Connect with Options.Vector does both.
type DB interface {
	Querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

var _ DB = (*pgxpool.Pool)(nil)

// collectStrings runs a query of one text column and returns its values.
func collectStrings(ctx context.Context, q Querier, sql string, args ...any) ([]string, error) {
	return collect[string](ctx, q, sql, args...)
}

func collect[T any](ctx context.Context, q Querier, sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[T])
}
