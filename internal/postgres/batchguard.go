package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A deletion batch takes one of two ways. The long way audits the schema
// in its transaction (ten catalog queries: they cost about as much as a
// small deletion), then finds the eligible sessions, then deletes them. The
// short way sends everything in one pipeline: its first statement locks
// the batch's sessions and, through lethe.require_batch (migration 00013),
// aborts the pipeline before any delete unless the catalog epoch is the one
// read around the long way's last compliant audit and every session of the
// batch is eligible. The epoch is a token every DDL command and every change
// to the registry replaces, with the identity of the event trigger that
// replaces it: disabling, re-enabling or re-creating the trigger changes it.

// catalogEpochExpr is the epoch, NULL where the event trigger is missing or
// not enabled ALWAYS; it fails where migration 00013 is not applied.
const catalogEpochExpr = `(SELECT e.token::text || '/' || t.oid::text || '/' || t.xmin::text
	FROM lethe.catalog_epoch e, pg_event_trigger t
	WHERE t.evtname = 'lethe_catalog_changed' AND t.evtevent = 'ddl_command_end' AND t.evtenabled = 'A'
	  AND t.evtfoid = 'lethe.catalog_changed()'::regprocedure)`

// catalogEpochSQL reads the epoch on its own (the long way, around its audit).
const catalogEpochSQL = `SELECT ` + catalogEpochExpr

// errShortWayDeclined: the short way's guard refused the batch.
var errShortWayDeclined = errors.New("the batch's pipeline guard declined it")

// sqlStateBatchGuard is lethe.require_batch's SQLSTATE.
const sqlStateBatchGuard = "LE004"

// eligibleCTEs are the guard's two steps (see eligibleSQL) with the request
// uid, the sessions and the tenant at the placeholders given.
func eligibleCTEs(l Layout, uid, ids, tenant string) string {
	return `l AS MATERIALIZED (
			SELECT record_id FROM lethe.erasure_ledger
			WHERE request_uid = ` + uid + ` AND scope = 'session' AND record_id = ANY(` + ids + `::text[])
			  AND cancelled_at IS NULL AND erased_at IS NULL AND grace_ends_at <= now()
			FOR UPDATE),
		s AS MATERIALIZED (
			SELECT s.id FROM ` + l.Sessions.Ident() + ` s
			WHERE s.id = ANY(ARRAY(SELECT record_id::uuid FROM l))
			  AND s.tombstoned_at IS NOT NULL AND (` + tenant + `::text IS NULL OR s.tenant_id = ` + tenant + `)
			ORDER BY s.id FOR UPDATE)`
}

// batchGuardSQL locks the batch's eligible sessions and raises LE004
// unless the catalog epoch is $4 and all of the sessions $2 are eligible
// ($1 the request, $3 the tenant).
func batchGuardSQL(l Layout) string {
	return `WITH ` + eligibleCTEs(l, "$1", "$2", "$3") + `
		SELECT lethe.require_batch(` + catalogEpochExpr + ` = $4,
			(SELECT count(*) FROM s) = cardinality($2::text[]))`
}

// declined reports whether the short way's pipeline failed at its guard —
// the guard refused, or cannot run (migration 00013 not applied):
// the long way then runs and reports what is wrong, if anything is.
func declined(p *pipeline, err error) bool {
	if err == nil || p.read != 0 {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// auditedEpoch is the catalog epoch the long way found compliant, or "".
func (e *Eraser) auditedEpoch() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.compliant
}

// guardSchemaRemembered is guardSchema, remembering the catalog epoch when
// the audit passes and the epoch read the same before and after it (a
// change committed while the audit ran is not taken as audited).
func (e *Eraser) guardSchemaRemembered(ctx context.Context, tx pgx.Tx) error {
	before := readEpoch(ctx, tx)
	if err := guardSchema(ctx, tx, e.Schema); err != nil {
		e.forgetEpoch()
		return err
	}
	if before == "" {
		return nil
	}
	if after := readEpoch(ctx, tx); after == before {
		e.mu.Lock()
		e.compliant = after
		e.mu.Unlock()
	}
	return nil
}

// readEpoch reads the catalog epoch under a savepoint, "" when there is
// none (no enabled event trigger, migration 00013 not applied), leaving tx
// usable.
func readEpoch(ctx context.Context, tx pgx.Tx) string {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return ""
	}
	var d *string
	if err := sp.QueryRow(ctx, catalogEpochSQL).Scan(&d); err != nil {
		_ = sp.Rollback(ctx)
		return ""
	}
	if sp.Commit(ctx) != nil || d == nil {
		return ""
	}
	return *d
}

func (e *Eraser) forgetEpoch() {
	e.mu.Lock()
	e.compliant = ""
	e.mu.Unlock()
}
