package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// intactSQL compares, in one statement, what the requests say they erased
// (pairs of request UID $1 and session ID $2) with the database: sessions
// of the tenant $3 that exist again, and found sessions without an erased
// ledger row. Only requests with a finding come back.
func intactSQL(l Layout) string {
	return `SELECT uid, count(*) FILTER (WHERE back), count(*) FILTER (WHERE missing) FROM (
			SELECT f.uid, s.id IS NOT NULL AS back, NOT EXISTS (SELECT 1 FROM lethe.erasure_ledger e
				WHERE e.request_uid = f.uid AND e.scope = 'session' AND e.record_id = f.id AND e.erased_at IS NOT NULL) AS missing
			FROM unnest($1::text[], $2::text[]) AS f(uid, id)
			LEFT JOIN ` + l.Sessions.Ident() + ` s ON s.id = f.id::uuid AND ($3::text IS NULL OR s.tenant_id = $3)
		) x GROUP BY uid HAVING bool_or(back) OR bool_or(missing) ORDER BY uid`
}

// Intact checks that the database still holds the erasures of reqs (each
// the sessions a request found and erased): it reports the requests whose
// sessions exist again or whose ledger rows are gone — a restore. Read only.
func (e *Eraser) Intact(ctx context.Context, reqs []erasure.Request) ([]erasure.RestoreFinding, error) {
	var out []erasure.RestoreFinding
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		var err error
		out, err = e.intact(ctx, tx, l, reqs)
		return err
	})
	return out, err
}

func (e *Eraser) intact(ctx context.Context, q Querier, l Layout, reqs []erasure.Request) ([]erasure.RestoreFinding, error) {
	var uids, ids []string
	for _, r := range reqs {
		for _, id := range r.SessionIDs {
			uids, ids = append(uids, r.UID), append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, intactSQL(l), uids, ids, e.tenant())
	if err != nil {
		return nil, fmt.Errorf("check erasures: %w", err)
	}
	var out []erasure.RestoreFinding
	var f erasure.RestoreFinding
	_, err = pgx.ForEachRow(rows, []any{&f.UID, &f.SessionsBack, &f.LedgerRowsMissing}, func() error {
		out = append(out, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("check erasures: %w", err)
	}
	return out, nil
}
