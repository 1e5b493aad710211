package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Receipt steps, the step column of lethe.erasure_receipts.
const (
	StepTombstoned  = "Tombstoned"
	StepDeleted     = "Deleted"
	StepCancelled   = "Cancelled"
	StepResurrected = "Resurrected"
)

// Eraser runs the erasure steps of one request on one memory database. Every
// method is safe to repeat: running it again after a crash anywhere gives
// the same end state, and a receipt is written once per (request, step, batch).
type Eraser struct {
	Pool *pgxpool.Pool
	// Schema of the memory tables (e.g. "memory").
	Schema string
	// TenantID, when set, restricts every statement to sessions of that tenant.
	TenantID string

	mu     sync.Mutex
	loaded *Layout
}

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

// Request identifies the erasure request in the database.
type Request struct {
	UID string
	// SessionIDs requested (lowercase UUIDs).
	SessionIDs []string
	// Grace is the grace period; zero for immediate requests.
	Grace time.Duration
}

// Count is a number of rows for one table (or kind).
type Count struct {
	Table string
	Rows  int64
}

// Plan is what an erasure removes, taken in the tombstone transaction.
type Plan struct {
	Found               []string
	NotFound            []string
	Rows                []Count
	Embeddings          int64
	ContentIndexEntries int64
	DerivedRecords      int64
	// TombstonedAt and GraceEndsAt are the database's clock readings.
	TombstonedAt time.Time
	GraceEndsAt  time.Time
}

func (e *Eraser) tenant() *string {
	if e.TenantID == "" {
		return nil
	}
	return &e.TenantID
}

// Tombstone tombstones the request's sessions of this tenant, writes the
// ledger rows (sessions and the hashes of their content), takes the plan and
// writes the Tombstoned receipt, all in one transaction. digest computes the
// receipt's digest from the plan.
func (e *Eraser) Tombstone(ctx context.Context, req Request, digest func(Plan) (string, error)) (Plan, error) {
	return e.tombstone(ctx, req, false, digest)
}

// PlanOnly takes the same plan in a read-only transaction and changes nothing.
func (e *Eraser) PlanOnly(ctx context.Context, req Request) (Plan, error) {
	return e.tombstone(ctx, req, true, nil)
}

func (e *Eraser) tombstone(ctx context.Context, req Request, dryRun bool, digest func(Plan) (string, error)) (Plan, error) {
	var plan Plan
	opts := pgx.TxOptions{}
	if dryRun {
		opts.AccessMode = pgx.ReadOnly
	}
	err := pgx.BeginTxFunc(ctx, e.Pool, opts, func(tx pgx.Tx) error {
		layout, err := e.layout(ctx, tx)
		if err != nil {
			return err
		}
		lock := " FOR UPDATE"
		if dryRun {
			lock = ""
		}
		rows, err := tx.Query(ctx, `SELECT id::text FROM `+layout.Sessions.Ident()+`
			WHERE id = ANY($1::uuid[]) AND ($2::text IS NULL OR tenant_id = $2) ORDER BY id`+lock, req.SessionIDs, e.tenant())
		if err != nil {
			return fmt.Errorf("find sessions: %w", err)
		}
		if plan.Found, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return fmt.Errorf("find sessions: %w", err)
		}
		for _, id := range req.SessionIDs {
			if !slices.Contains(plan.Found, id) {
				plan.NotFound = append(plan.NotFound, id)
			}
		}
		hashes, err := e.contentHashes(ctx, tx, layout, plan.Found)
		if err != nil {
			return err
		}
		if err := e.countPlan(ctx, tx, layout, plan.Found, hashes, &plan); err != nil {
			return err
		}
		if dryRun {
			return tx.QueryRow(ctx, `SELECT now(), now() + make_interval(secs => $1)`, req.Grace.Seconds()).Scan(&plan.TombstonedAt, &plan.GraceEndsAt)
		}

		if _, err := tx.Exec(ctx, `UPDATE `+layout.Sessions.Ident()+` SET tombstoned_at = now(), tombstoned_by = $2
			WHERE id = ANY($1::uuid[]) AND tombstoned_at IS NULL`, plan.Found, req.UID); err != nil {
			return fmt.Errorf("tombstone sessions: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at)
			SELECT 'session', id, $2, $3, now(), now() + make_interval(secs => $4) FROM unnest($1::text[]) AS id
			ON CONFLICT DO NOTHING`, plan.Found, req.UID, e.tenant(), req.Grace.Seconds()); err != nil {
			return fmt.Errorf("write ledger: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at)
			SELECT 'content', h, $2, $3, now(), now() + make_interval(secs => $4) FROM unnest($1::text[]) AS h
			ON CONFLICT DO NOTHING`, hashes, req.UID, e.tenant(), req.Grace.Seconds()); err != nil {
			return fmt.Errorf("write content ledger: %w", err)
		}
		// The first tombstone's clock readings, so a repeat reports the same times.
		if err := tx.QueryRow(ctx, `SELECT coalesce(min(tombstoned_at), now()), coalesce(min(grace_ends_at), now() + make_interval(secs => $2))
			FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session'`, req.UID, req.Grace.Seconds()).
			Scan(&plan.TombstonedAt, &plan.GraceEndsAt); err != nil {
			return fmt.Errorf("read ledger: %w", err)
		}
		d, err := digest(plan)
		if err != nil {
			return err
		}
		return writeReceipt(ctx, tx, req.UID, StepTombstoned, 0, len(plan.Found), plan.Rows, d)
	})
	return plan, err
}

// countPlan fills the plan's counts for the given sessions and the hashes of their content.
func (e *Eraser) countPlan(ctx context.Context, tx pgx.Tx, l Layout, ids, hashes []string, plan *Plan) error {
	for _, t := range append([]Table{l.Sessions}, l.Children...) {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+t.Ident()+` WHERE `+pgx.Identifier{l.sessionKey(t)}.Sanitize()+` = ANY($1::uuid[])`, ids).Scan(&n); err != nil {
			return fmt.Errorf("count %s: %w", t, err)
		}
		plan.Rows = append(plan.Rows, Count{Table: t.String(), Rows: n})
	}
	plan.Embeddings = 0
	for _, v := range l.Vectors {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(`+v.Ident()+`) FROM `+v.Table.Ident()+` WHERE `+pgx.Identifier{l.sessionKey(v.Table)}.Sanitize()+` = ANY($1::uuid[])`, ids).Scan(&n); err != nil {
			return fmt.Errorf("count embeddings in %s: %w", v, err)
		}
		plan.Embeddings += n
	}
	plan.ContentIndexEntries = 0
	for _, idx := range l.ContentIndexes {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+idx.Table.Ident()+` WHERE `+idx.Ident()+` = ANY($1::text[])`, hashes).Scan(&n); err != nil {
			return fmt.Errorf("count %s: %w", idx.Table, err)
		}
		plan.ContentIndexEntries += n
	}
	plan.DerivedRecords = 0
	for _, lin := range l.Lineages {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(DISTINCT `+pgx.Identifier{lin.DerivedColumn}.Sanitize()+`) FROM `+lin.Table.Ident()+
			` WHERE `+lin.SourceMatch(1), ids).Scan(&n); err != nil {
			return fmt.Errorf("count derived records via %s: %w", lin.Table, err)
		}
		plan.DerivedRecords += n
	}
	return nil
}

// contentHashes returns the distinct content hashes of the sessions' rows.
func (e *Eraser) contentHashes(ctx context.Context, tx pgx.Tx, l Layout, ids []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, src := range l.ContentSources {
		rows, err := tx.Query(ctx, `SELECT DISTINCT `+src.Ident()+` FROM `+src.Table.Ident()+
			` WHERE `+pgx.Identifier{l.sessionKey(src.Table)}.Sanitize()+` = ANY($1::uuid[]) AND `+src.Ident()+` IS NOT NULL`, ids)
		if err != nil {
			return nil, fmt.Errorf("read content hashes of %s: %w", src, err)
		}
		hs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read content hashes of %s: %w", src, err)
		}
		for _, h := range hs {
			if !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

func writeReceipt(ctx context.Context, tx pgx.Tx, uid, step string, batch, sessions int, counts []Count, digest string) error {
	m := map[string]int64{}
	for _, c := range counts {
		m[c.Table] = c.Rows
	}
	countsJSON, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO lethe.erasure_receipts (request_uid, step, batch, sessions, counts, digest)
		VALUES ($1, $2, $3, $4, $5::jsonb, $6) ON CONFLICT (request_uid, step, batch) DO NOTHING`, uid, step, batch, sessions, string(countsJSON), digest)
	if err != nil {
		return fmt.Errorf("write %s receipt: %w", step, err)
	}
	return nil
}

// GraceState is the grace period by the database's clock.
type GraceState struct {
	Now         time.Time
	GraceEndsAt time.Time
	Elapsed     bool
}

// Grace reads the request's grace period end and the database's clock.
func (e *Eraser) Grace(ctx context.Context, uid string) (GraceState, error) {
	var g GraceState
	var ends *time.Time
	err := e.Pool.QueryRow(ctx, `SELECT now(), max(grace_ends_at) FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'session'`, uid).Scan(&g.Now, &ends)
	if err != nil {
		return g, fmt.Errorf("read grace period: %w", err)
	}
	if ends == nil {
		// No session found: nothing to wait for.
		g.GraceEndsAt, g.Elapsed = g.Now, true
		return g, nil
	}
	g.GraceEndsAt = *ends
	g.Elapsed = !g.Now.Before(*ends)
	return g, nil
}

// ErrTooLateToCancel means some sessions of the request are already erased.
var ErrTooLateToCancel = errors.New("the deletion has already started; the request can no longer be cancelled")

// Cancel lifts the request's tombstones (unless another active request holds
// the same session), marks its ledger rows cancelled and writes the Cancelled
// receipt, in one transaction. It refuses when any session is already erased.
func (e *Eraser) Cancel(ctx context.Context, uid string, digest string) (lifted int64, at time.Time, err error) {
	err = pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		// Already cancelled (a retry after a lost status write): report the first run's figures.
		var n int
		err = tx.QueryRow(ctx, `SELECT sessions, recorded_at FROM lethe.erasure_receipts
			WHERE request_uid = $1 AND step = $2 AND batch = 0`, uid, StepCancelled).Scan(&n, &at)
		if err == nil {
			lifted = int64(n)
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read receipts: %w", err)
		}
		// Lock the request's ledger rows first: a deletion holding them
		// finishes before this reads them, and one that comes later sees the
		// cancel. Either way exactly one of the two takes effect.
		rows, err := tx.Query(ctx, `SELECT erased_at IS NOT NULL FROM lethe.erasure_ledger
			WHERE request_uid = $1 AND scope = 'session' FOR UPDATE`, uid)
		if err != nil {
			return fmt.Errorf("lock ledger: %w", err)
		}
		erased, err := pgx.CollectRows(rows, pgx.RowTo[bool])
		if err != nil {
			return fmt.Errorf("lock ledger: %w", err)
		}
		if slices.Contains(erased, true) {
			return ErrTooLateToCancel
		}
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&at); err != nil {
			return err
		}
		sessions := pgx.Identifier{e.Schema, "sessions"}.Sanitize()
		if _, err := tx.Exec(ctx, `UPDATE lethe.erasure_ledger SET cancelled_at = now()
			WHERE request_uid = $1 AND erased_at IS NULL AND cancelled_at IS NULL`, uid); err != nil {
			return fmt.Errorf("cancel ledger rows: %w", err)
		}
		// Hand a shared tombstone over to another active request, or lift it.
		if _, err := tx.Exec(ctx, `UPDATE `+sessions+` s SET tombstoned_by = o.request_uid
			FROM (SELECT DISTINCT ON (record_id) record_id, request_uid FROM lethe.erasure_ledger
			      WHERE scope = 'session' AND cancelled_at IS NULL AND request_uid <> $1 ORDER BY record_id, tombstoned_at) o
			WHERE s.tombstoned_by = $1 AND o.record_id = s.id::text`, uid); err != nil {
			return fmt.Errorf("hand over shared tombstones: %w", err)
		}
		res, err := tx.Exec(ctx, `UPDATE `+sessions+` SET tombstoned_at = NULL, tombstoned_by = NULL WHERE tombstoned_by = $1`, uid)
		if err != nil {
			return fmt.Errorf("lift tombstones: %w", err)
		}
		lifted = res.RowsAffected()
		return writeReceipt(ctx, tx, uid, StepCancelled, 0, int(lifted), nil, digest)
	})
	return lifted, at, err
}
