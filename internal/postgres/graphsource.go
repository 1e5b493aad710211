package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// GraphSource answers the graph sweep's question — which provenance still
// exists — from the memory tables. Tombstoned sessions still exist: a
// cancel can bring them back.
type GraphSource struct {
	Pool Querier
	// Schema of the memory tables (e.g. "memory").
	Schema string
}

// MissingSessions returns the IDs with no row in <schema>.sessions.
func (s GraphSource) MissingSessions(ctx context.Context, ids []string) ([]string, error) {
	return missing(ctx, s.Pool, Table{s.Schema, "sessions"}, "uuid", ids)
}

// MissingFacts returns the IDs with no row in <schema>.facts.
func (s GraphSource) MissingFacts(ctx context.Context, ids []int64) ([]int64, error) {
	return missing(ctx, s.Pool, Table{s.Schema, "facts"}, "bigint", ids)
}

// missingSQL selects the IDs $1 (of SQL type typ) with no row in t.
func missingSQL(t Table, typ string) string {
	return `SELECT x FROM unnest($1::` + typ + `[]) AS x
		WHERE NOT EXISTS (SELECT 1 FROM ` + t.Ident() + ` t WHERE t.id = x)`
}

func missing[T any](ctx context.Context, q Querier, t Table, typ string, ids []T) ([]T, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, missingSQL(t, typ), ids)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", t.Ident(), err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", t.Ident(), err)
	}
	return out, nil
}
