package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// The ledger: tombstones, grace periods and cancellations of requests,
// recorded in lethe.erasure_ledger by the database's clock.

// planClockSQL reads the database's clock and the end of a grace period $1
// (in seconds) starting now.
const planClockSQL = `SELECT now(), now() + make_interval(secs => $1)`

// Plan takes the plan Tombstone would take, in a read-only transaction,
// and changes nothing.
func (e *Eraser) Plan(ctx context.Context, req erasure.Request) (erasure.Plan, error) {
	var plan erasure.Plan
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		var err error
		if plan, err = e.takePlan(ctx, tx, l, req, false); err != nil {
			return err
		}
		return tx.QueryRow(ctx, planClockSQL, req.Grace.Seconds()).Scan(&plan.TombstonedAt, &plan.GraceEndsAt)
	})
	return plan, err
}

const (
	// ledgerInsertSQL writes the ledger rows of scope $5 for the records $1;
	// a keyed scope's rows say the key they are under (key_id, read once).
	ledgerInsertSQL = `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, key_id)
		SELECT $5::text, r, $2, $3, now(), now() + make_interval(secs => $4),
			CASE WHEN $5::text <> 'session' THEN (SELECT lethe.erasure_key_id()) END
		FROM unnest($1::text[]) AS r
		ON CONFLICT DO NOTHING`
	// firstTombstoneSQL reads the request's first tombstone's clock readings.
	firstTombstoneSQL = `SELECT coalesce(min(tombstoned_at), now()), coalesce(min(grace_ends_at), now() + make_interval(secs => $2))
		FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session'`
)

// contentLedgerSQL writes the ledger rows of the content of the sessions
// $1 for the request $2, the store's tenant $3 (NULL: every tenant) and a
// grace period of $4 seconds: keyed hashes (lethe.content_hash, computed by
// the database with its key), so that the ledger is no dictionary of erased
// content.
func contentLedgerSQL(l Layout) string {
	return `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, key_id)
		SELECT 'content', lethe.content_hash(h), $2, $3, now(), now() + make_interval(secs => $4), (SELECT lethe.erasure_key_id())
		FROM (` + sessionHashesSQL(l) + `) c
		ON CONFLICT DO NOTHING`
}

// writeContent writes the ledger rows of the content of the sessions ids.
func (e *Eraser) writeContent(ctx context.Context, tx pgx.Tx, l Layout, req erasure.Request, ids []string) error {
	if len(l.ContentSources) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, contentLedgerSQL(l), ids, req.UID, e.tenant(), req.Grace.Seconds()); err != nil {
		return fmt.Errorf("write content ledger: %w", err)
	}
	return nil
}

// hiddenAtSQL reads the latest tombstone of the sessions $1 (the epoch
// when none).
func hiddenAtSQL(l Layout) string {
	return `SELECT coalesce(max(tombstoned_at), 'epoch') FROM ` + l.Sessions.Ident() + ` WHERE id = ANY($1::uuid[])`
}

// Tombstone tombstones the request's sessions of this tenant, writes the
// ledger rows (sessions and the keyed hashes of their content), takes the plan and
// writes the Tombstoned receipt (its digest that of the plan), all in one
// transaction. A repeat reports the first run's clock readings.
func (e *Eraser) Tombstone(ctx context.Context, req erasure.Request) (erasure.Plan, error) {
	var plan erasure.Plan
	err := e.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx, l Layout) error {
		if err := lockUncancelled(ctx, tx, req.UID); err != nil {
			return err
		}
		// The sessions' locks before their rows, in the order a cancel takes
		// them: the other order deadlocked with an overlapping cancel.
		if _, err := tx.Exec(ctx, lockSessionsSQL, req.SessionIDs); err != nil {
			return fmt.Errorf("wait for derivations in flight: %w", err)
		}
		var err error
		if plan, err = e.takePlan(ctx, tx, l, req, true); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, tombstoneSQL(l), plan.Found, req.UID); err != nil {
			return fmt.Errorf("tombstone sessions: %w", err)
		}
		if err := tx.QueryRow(ctx, hiddenAtSQL(l), plan.Found).Scan(&plan.HiddenAt); err != nil {
			return fmt.Errorf("read the tombstones: %w", err)
		}
		if err := e.writeSessionLedger(ctx, tx, l, req, plan.Found); err != nil {
			return fmt.Errorf("write ledger: %w", err)
		}
		if err := e.writeContent(ctx, tx, l, req, plan.Found); err != nil {
			return err
		}
		if err := e.writeSources(ctx, tx, l, req, plan.Found); err != nil {
			return err
		}
		// The first tombstone's clock readings, so a repeat reports the same times.
		if err := tx.QueryRow(ctx, firstTombstoneSQL, req.UID, req.Grace.Seconds()).Scan(&plan.TombstonedAt, &plan.GraceEndsAt); err != nil {
			return fmt.Errorf("read ledger: %w", err)
		}
		return receipt{uid: req.UID, step: erasure.StepTombstoned, sessions: len(plan.Found), counts: plan.Rows, of: erasure.PlanStatus(plan)}.write(ctx, tx)
	})
	if err != nil {
		return plan, err
	}
	// Read after the commit (or, on a repeat, after the first one's): the
	// replicas hide the sessions once they replay past it.
	if err := e.Pool.QueryRow(ctx, walPositionSQL).Scan(&plan.CommitLSN); err != nil {
		return plan, fmt.Errorf("read WAL position: %w", err)
	}
	return plan, nil
}

// sourceHashesSQL reads the keyed hashes of the source identifiers in src
// of the sessions $1 (lethe.source_hash: the identifier never leaves the
// database, and the ledger holds no dictionary-reversible copy of it).
func sourceHashesSQL(src QColumn) string {
	return `SELECT DISTINCT lethe.source_hash(` + src.Ident() + `) FROM ` + src.Table.Ident() +
		` WHERE id = ANY($1::uuid[]) AND ` + src.Ident() + ` IS NOT NULL`
}

// writeSources writes the ledger rows of the sessions' sources, so that
// the sessions table refuses them (LE002) while the request holds them.
func (e *Eraser) writeSources(ctx context.Context, tx pgx.Tx, l Layout, req erasure.Request, ids []string) error {
	for _, src := range l.SourceColumns {
		hashes, err := collectStrings(ctx, tx, sourceHashesSQL(src), ids)
		if err != nil {
			return fmt.Errorf("read source hashes of %s: %w", src, err)
		}
		if err := e.writeLedger(ctx, tx, req, "source", hashes); err != nil {
			return fmt.Errorf("write source ledger: %w", err)
		}
	}
	return nil
}

func (e *Eraser) writeLedger(ctx context.Context, tx pgx.Tx, req erasure.Request, scope string, records []string) error {
	_, err := tx.Exec(ctx, ledgerInsertSQL, records, req.UID, e.tenant(), req.Grace.Seconds(), scope)
	return err
}

// findSessionsSQL finds the sessions $1 of the tenant $2 (NULL: any),
// locking them when the plan is taken to tombstone them.
func findSessionsSQL(l Layout, lock bool) string {
	sql := `SELECT id::text FROM ` + l.Sessions.Ident() + `
		WHERE id = ANY($1::uuid[]) AND ($2::text IS NULL OR tenant_id = $2) ORDER BY id`
	if lock {
		sql += ` FOR UPDATE`
	}
	return sql
}

// takePlan finds the request's sessions and counts what their erasure removes.
func (e *Eraser) takePlan(ctx context.Context, tx pgx.Tx, l Layout, req erasure.Request, lock bool) (erasure.Plan, error) {
	var plan erasure.Plan
	found, err := collectStrings(ctx, tx, findSessionsSQL(l, lock), req.SessionIDs, e.tenant())
	if err != nil {
		return plan, fmt.Errorf("find sessions: %w", err)
	}
	plan.Found = found
	for _, id := range req.SessionIDs {
		if !slices.Contains(found, id) {
			plan.NotFound = append(plan.NotFound, id)
		}
	}
	return plan, countPlan(ctx, tx, l, found, e.tenant(), &plan)
}

// countEmbeddingsSQL counts the embeddings of the sessions $1 in v.
func countEmbeddingsSQL(l Layout, v QColumn) string {
	return `SELECT count(` + v.Ident() + `) FROM ` + v.Table.Ident() + ` WHERE ` + l.sessionKey(v.Table) + ` = ANY($1::uuid[])`
}

// countDerivedSQL counts the derived records whose lineage names one of the sessions $1.
func countDerivedSQL(lin Lineage) string {
	return `SELECT count(DISTINCT ` + pgx.Identifier{lin.DerivedColumn}.Sanitize() + `) FROM ` + lin.Table.Ident() +
		` WHERE ` + lin.SourceMatch(1)
}

// countPlan fills the plan's counts for the given sessions, erased for the tenant (nil: every tenant).
func countPlan(ctx context.Context, tx pgx.Tx, l Layout, ids []string, tenant *string, plan *erasure.Plan) error {
	for _, c := range rowCountings(l, ids, "count") {
		n, err := c.run(ctx, tx)
		if err != nil {
			return err
		}
		plan.Rows = append(plan.Rows, erasure.Count{Table: c.name, Rows: n})
	}
	var embeddings, content, derived []counting
	for _, v := range l.Vectors {
		embeddings = append(embeddings, counting{failure: "count embeddings in " + v.String(), sql: countEmbeddingsSQL(l, v), arg: ids})
	}
	for _, idx := range l.ContentIndexes {
		if len(l.ContentSources) > 0 {
			content = append(content, counting{failure: "count " + idx.Table.String(), sql: countContentSQL(l, idx), args: contentArgs(idx, ids, tenant)})
		}
	}
	for _, lin := range l.Lineages {
		derived = append(derived, counting{failure: "count derived records via " + lin.Table.String(), sql: countDerivedSQL(lin), arg: ids})
	}
	var err error
	if plan.Embeddings, err = sum(ctx, tx, embeddings); err != nil {
		return err
	}
	if plan.ContentIndexEntries, err = sum(ctx, tx, content); err != nil {
		return err
	}
	plan.DerivedRecords, err = sum(ctx, tx, derived)
	return err
}

// graceSQL reads the database's clock and the end of the request's grace period.
const graceSQL = `SELECT now(), max(grace_ends_at), count(*), count(*) FILTER (WHERE erased_at IS NULL), min(tombstoned_at), min(grace_ends_at)
	FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session'`

// Grace reads the request's grace period end and the database's clock.
func (e *Eraser) Grace(ctx context.Context, uid string) (erasure.GraceState, error) {
	var g erasure.GraceState
	var ends, tombstoned, earliest *time.Time
	if err := e.Pool.QueryRow(ctx, graceSQL, uid).Scan(&g.Now, &ends, &g.LedgerRows, &g.NotErased, &tombstoned, &earliest); err != nil {
		return g, fmt.Errorf("read grace period: %w", err)
	}
	if tombstoned != nil {
		g.TombstonedAt, g.EarliestEnd = *tombstoned, *earliest
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

// Cancel lifts the request's tombstones (unless another active request holds
// the same session), marks its ledger rows cancelled and writes the Cancelled
// receipt, in one transaction. It refuses with erasure.ErrTooLateToCancel
// when any session is already erased. A repeat reports the first run's figures.
func (e *Eraser) Cancel(ctx context.Context, uid string) (erasure.Cancellation, error) {
	var c erasure.Cancellation
	err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		// A tombstone of the request in flight commits first, and is lifted.
		if _, err := tx.Exec(ctx, lockRequestSQL, uid); err != nil {
			return fmt.Errorf("lock the request: %w", err)
		}
		// Already cancelled (a retry after a lost status write): report the first run's figures.
		if done, err := previousCancel(ctx, tx, uid, &c); err != nil || done {
			return err
		}
		// Every statement after this sees what a cancel, tombstone or
		// deletion of an overlapping request committed while it waited.
		if _, err := tx.Exec(ctx, lockLedgerSessionsSQL, uid); err != nil {
			return fmt.Errorf("lock the request's sessions: %w", err)
		}
		if err := lockUnerased(ctx, tx, uid); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, nowSQL).Scan(&c.At); err != nil {
			return err
		}
		lifted, err := e.liftTombstones(ctx, tx, uid)
		if err != nil {
			return err
		}
		c.Lifted = lifted
		return receipt{uid: uid, step: erasure.StepCancelled, sessions: int(lifted), of: map[string]string{"cancelled": uid}}.write(ctx, tx)
	})
	return c, err
}

// lockUncancelled takes the request's lock and refuses with
// erasure.ErrCancelled when it was cancelled: a tombstone runs after the
// request's cancel, or before it (which then lifts what it writes), never
// commits after it.
func lockUncancelled(ctx context.Context, tx pgx.Tx, uid string) error {
	if _, err := tx.Exec(ctx, lockRequestSQL, uid); err != nil {
		return fmt.Errorf("lock the request: %w", err)
	}
	var c erasure.Cancellation
	cancelled, err := previousCancel(ctx, tx, uid, &c)
	if err != nil || cancelled {
		return cmp.Or(err, erasure.ErrCancelled)
	}
	return nil
}

// lockRequestSQL takes the request $1's exclusive transaction-scoped lock,
// before any session's: its tombstone and its cancel run one after the
// other. A cancel that finds no ledger row locks no session, so without it
// a tombstone already past its check could commit after the cancel.
const lockRequestSQL = `SELECT pg_advisory_xact_lock(hashtext('lethe.request'), hashtext($1))`

// lockLedgerSessionsSQL takes, in a fixed order, the sessions' exclusive
// locks (those of lockSessionsSQL) for every session the request $1 holds
// in the ledger. Two overlapping requests cancelled at once then run one
// after the other: otherwise each could hand the shared tombstone to the
// other, still active in its snapshot, and both commit, leaving it held by
// a cancelled request for ever.
const lockLedgerSessionsSQL = `SELECT count(pg_advisory_xact_lock(hashtext('lethe.session'), hashtext(record_id)))
	FROM (SELECT record_id FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session' ORDER BY record_id) s`

// cancelReceiptSQL reads the Cancelled receipt of a request.
const cancelReceiptSQL = `SELECT sessions, recorded_at FROM lethe.erasure_receipts
	WHERE request_uid = $1 AND step = $2 AND batch = 0`

// previousCancel fills c from the Cancelled receipt, when there is one.
func previousCancel(ctx context.Context, tx pgx.Tx, uid string, c *erasure.Cancellation) (bool, error) {
	var n int
	err := tx.QueryRow(ctx, cancelReceiptSQL, uid, erasure.StepCancelled).Scan(&n, &c.At)
	switch {
	case err == nil:
		c.Lifted = int64(n)
		return true, nil
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	}
	return false, fmt.Errorf("read receipts: %w", err)
}

// lockLedgerSQL locks the request's session ledger rows and tells which are erased.
const lockLedgerSQL = `SELECT erased_at IS NOT NULL FROM lethe.erasure_ledger
	WHERE request_uid = $1 AND scope = 'session' FOR UPDATE`

// lockUnerased locks the request's ledger rows first: a deletion holding
// them finishes before this reads them, and one that comes later sees the
// cancel. Either way exactly one of the two takes effect.
func lockUnerased(ctx context.Context, tx pgx.Tx, uid string) error {
	rows, err := tx.Query(ctx, lockLedgerSQL, uid)
	if err != nil {
		return fmt.Errorf("lock ledger: %w", err)
	}
	erased, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return fmt.Errorf("lock ledger: %w", err)
	}
	if slices.Contains(erased, true) {
		return erasure.ErrTooLateToCancel
	}
	return nil
}

// cancelLedgerSQL marks the request's ledger rows not yet erased cancelled.
const cancelLedgerSQL = `UPDATE lethe.erasure_ledger SET cancelled_at = now()
	WHERE request_uid = $1 AND erased_at IS NULL AND cancelled_at IS NULL`

// handOverSQL hands the request's tombstones over to the oldest other
// active request holding the same session.
func handOverSQL(sessions Table) string {
	return `UPDATE ` + sessions.Ident() + ` s SET tombstoned_by = o.request_uid
		FROM (SELECT DISTINCT ON (record_id) record_id, request_uid FROM lethe.erasure_ledger
		      WHERE scope = 'session' AND cancelled_at IS NULL AND request_uid <> $1 ORDER BY record_id, tombstoned_at) o
		WHERE s.tombstoned_by = $1 AND o.record_id = s.id::text`
}

// liftSQL lifts the tombstones the request still holds.
func liftSQL(sessions Table) string {
	return `UPDATE ` + sessions.Ident() + ` SET tombstoned_at = NULL, tombstoned_by = NULL WHERE tombstoned_by = $1`
}

// liftTombstones cancels the ledger rows, hands a shared tombstone over to
// another active request or lifts it, and returns how many were lifted.
func (e *Eraser) liftTombstones(ctx context.Context, tx pgx.Tx, uid string) (int64, error) {
	if _, err := tx.Exec(ctx, cancelLedgerSQL, uid); err != nil {
		return 0, fmt.Errorf("cancel ledger rows: %w", err)
	}
	if _, err := tx.Exec(ctx, handOverSQL(e.sessions()), uid); err != nil {
		return 0, fmt.Errorf("hand over shared tombstones: %w", err)
	}
	res, err := tx.Exec(ctx, liftSQL(e.sessions()), uid)
	if err != nil {
		return 0, fmt.Errorf("lift tombstones: %w", err)
	}
	return res.RowsAffected(), nil
}

// erasedSessionsSQL lists the sessions a request erased, sorted.
const erasedSessionsSQL = `SELECT record_id FROM lethe.erasure_ledger
	WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL ORDER BY record_id`

// ErasedSessions returns the sessions this request erased, sorted. The
// graph step prunes exactly these: the sessions of the store's tenant that
// the request found and deleted, never the IDs as requested.
func (e *Eraser) ErasedSessions(ctx context.Context, uid string) ([]string, error) {
	ids, err := collectStrings(ctx, e.Pool, erasedSessionsSQL, uid)
	if err != nil {
		return nil, fmt.Errorf("read erased sessions: %w", err)
	}
	return ids, nil
}

// deletedAtSQL reads when a request's deletion last committed.
const deletedAtSQL = `SELECT max(erased_at) FROM lethe.erasure_ledger
	WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL`

// DeletedAt is when this request's deletion last committed (the latest
// erased_at of its sessions, by the database's clock); zero when it erased
// nothing. Backups started before it may hold the erased sessions.
func (e *Eraser) DeletedAt(ctx context.Context, uid string) (time.Time, error) {
	var t *time.Time
	if err := e.Pool.QueryRow(ctx, deletedAtSQL, uid).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the deletion time: %w", err)
	}
	if t == nil {
		return time.Time{}, nil
	}
	return *t, nil
}

// erasedSessionsOfGoneSQL reads the sessions the tenant's ($3, NULL: any)
// requests erased since $2, the requests $1 (those that still have an
// object) left out.
const erasedSessionsOfGoneSQL = `SELECT DISTINCT record_id FROM lethe.erasure_ledger
	WHERE scope = 'session' AND erased_at >= $2 AND cancelled_at IS NULL
	  AND NOT (request_uid = ANY($1::text[])) AND ($3::text IS NULL OR tenant_id = $3)
	ORDER BY 1`

// ErasedSessionsOfGoneRequests lists the sessions erased since since by
// requests other than live: requests whose object is gone, which no longer
// re-verify their own erasure.
func (e *Eraser) ErasedSessionsOfGoneRequests(ctx context.Context, live []string, since time.Time) ([]string, error) {
	if live == nil {
		live = []string{}
	}
	return collectStrings(ctx, e.Pool, erasedSessionsOfGoneSQL, live, since, e.tenant())
}

// sessionLedgerSQL is ledgerInsertSQL for session rows, with the digest
// $5 of the layout their content and source rows are written from
// (migration 00018). A repeat keeps the first run's: the rows it wrote are
// still there, and a digest that is not the deletion's makes it write the
// rows again.
const sessionLedgerSQL = `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, layout_digest)
	SELECT 'session', r, $2, $3, now(), now() + make_interval(secs => $4), $5 FROM unnest($1::text[]) AS r
	ON CONFLICT DO NOTHING`

// writeSessionLedger writes the session rows of the sessions ids, with
// the digest of l where the ledger records it.
func (e *Eraser) writeSessionLedger(ctx context.Context, tx pgx.Tx, l Layout, req erasure.Request, ids []string) error {
	if !l.LedgerTagsLayout {
		return e.writeLedger(ctx, tx, req, "session", ids)
	}
	_, err := tx.Exec(ctx, sessionLedgerSQL, ids, req.UID, e.tenant(), req.Grace.Seconds(), l.ContentDigest())
	return err
}

// staleLayoutSQL is, of the request $1's session rows of $2, those whose
// content and source rows were not written from a layout of digest $3.
const staleLayoutSQL = `SELECT record_id FROM lethe.erasure_ledger
	WHERE request_uid = $1 AND scope = 'session' AND record_id = ANY($2::text[])
	  AND layout_digest IS DISTINCT FROM $3::text`

// rewriteStaleContent writes again, from the audited layout l, the content
// and source rows of the sessions ids the tombstone wrote from another
// layout, or from one not recorded (a content source registered or a
// cascading table added since; migration 00018 not applied): the deletion
// removes what l reaches, and the ledger must refuse all of it back. The
// grace period is served.
func (e *Eraser) rewriteStaleContent(ctx context.Context, tx pgx.Tx, l Layout, uid string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	stale := ids
	if l.LedgerTagsLayout {
		var err error
		if stale, err = collectStrings(ctx, tx, staleLayoutSQL, uid, ids, l.ContentDigest()); err != nil {
			return fmt.Errorf("read the ledger's layouts: %w", err)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	req := erasure.Request{UID: uid}
	if err := e.writeContent(ctx, tx, l, req, stale); err != nil {
		return err
	}
	return e.writeSources(ctx, tx, l, req, stale)
}
