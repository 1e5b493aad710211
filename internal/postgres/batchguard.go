package postgres

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A deletion batch takes one of two ways. The long way audits the schema
// in its transaction (ten catalog queries: they cost about as much as a
// small deletion), then finds the eligible sessions, then deletes them. The
// short way sends everything in one pipeline: its first statement locks
// the batch's sessions and, through lethe.require_batch (migration 00013),
// aborts the pipeline before any delete unless the catalog epoch is the one
// read around the long way's last compliant audit, every session of the
// batch is eligible and its tombstone wrote its content rows from the
// layout the batch acts on (else the long way writes them again:
// ledger.go); its last statement checks the epoch again, as the long
// way's does once it audited under one. The epoch
// is a token every DDL command and every change to the registry replaces,
// with the identity (oid, row version) of everything that replaces it: the
// event trigger, the registry's triggers and tables, the functions, the
// token's table. Changing any of them changes the epoch, and the long way
// remembers an epoch only when that machinery is intact (mechanismIntactSQL).

// catalogEpochExpr is the epoch, NULL where the event trigger is missing or
// not enabled ALWAYS; it fails where migration 00013 is not applied.
const catalogEpochExpr = `(SELECT e.token::text || '/' || t.oid::text || ':' || t.xmin::text
		|| '/' || (SELECT string_agg(g.oid::text || ':' || g.xmin::text || ':' || g.tgenabled::text, ',' ORDER BY g.oid) FROM pg_trigger g
			WHERE g.tgrelid IN ('lethe.content_indexes'::regclass, 'lethe.lineage_tables'::regclass,
				'lethe.content_sources'::regclass, 'lethe.source_columns'::regclass) AND NOT g.tgisinternal)
		|| '/' || (SELECT string_agg(p.oid::text || ':' || p.xmin::text, ',' ORDER BY p.oid) FROM pg_proc p
			WHERE p.oid IN ('lethe.bump_catalog_epoch()'::regprocedure, 'lethe.catalog_changed()'::regprocedure,
				'lethe.registry_changed()'::regprocedure, 'lethe.require_batch(boolean, boolean)'::regprocedure))
		|| '/' || (SELECT string_agg(c.oid::text || ':' || c.xmin::text, ',' ORDER BY c.oid) FROM pg_class c
			WHERE c.oid IN ('lethe.catalog_epoch'::regclass, 'lethe.content_indexes'::regclass, 'lethe.lineage_tables'::regclass,
				'lethe.content_sources'::regclass, 'lethe.source_columns'::regclass))
	FROM lethe.catalog_epoch e, pg_event_trigger t
	WHERE t.evtname = 'lethe_catalog_changed' AND t.evtevent = 'ddl_command_end' AND t.evtenabled = 'A'
	  AND t.evtfoid = 'lethe.catalog_changed()'::regprocedure)`

// catalogEpochSQL reads the epoch on its own.
const catalogEpochSQL = `SELECT ` + catalogEpochExpr

// Digests (md5 of prosrc) of the bodies migration 00013 gives the functions
// that replace the token: the long way remembers no epoch if one was
// replaced by another body.
const (
	bumpCatalogEpochBody = "094752a185352ff8159ff714bcf8da75"
	catalogChangedBody   = "efc2a828a13f6bcfaf9fe188aad8a500"
	registryChangedBody  = "4d62919bed72157d025d3814f69cfca2"
)

// mechanismIntactSQL is true when what replaces the token is as migrations
// 00013 and 00017 made it ($1, $2, $3: the bodies' digests): the event
// trigger and the statement triggers of the four registry tables enabled ALWAYS, the functions' bodies,
// the token's table without rules, triggers or row-level security, no
// table inheriting from it or from the registry, and no column,
// constraint, trigger or policy of a permanent table depending on a
// temporary object (ending a session or DISCARD TEMP drops it with no DDL
// command the event trigger could see).
const mechanismIntactSQL = `SELECT
	EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lethe_catalog_changed' AND evtevent = 'ddl_command_end'
		AND evtenabled = 'A' AND evtfoid = 'lethe.catalog_changed()'::regprocedure)
	AND (SELECT count(*) FROM pg_trigger g WHERE g.tgrelid IN ('lethe.content_indexes'::regclass, 'lethe.lineage_tables'::regclass,
				'lethe.content_sources'::regclass, 'lethe.source_columns'::regclass)
		AND NOT g.tgisinternal AND g.tgenabled = 'A' AND g.tgfoid = 'lethe.registry_changed()'::regprocedure
		AND g.tgtype & 1 = 0 AND g.tgtype & 60 = 60) = 4
	AND (SELECT md5(prosrc) FROM pg_proc WHERE oid = 'lethe.bump_catalog_epoch()'::regprocedure) = $1
	AND (SELECT md5(prosrc) FROM pg_proc WHERE oid = 'lethe.catalog_changed()'::regprocedure) = $2
	AND (SELECT md5(prosrc) FROM pg_proc WHERE oid = 'lethe.registry_changed()'::regprocedure) = $3
	AND NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = 'lethe.catalog_epoch'::regclass AND (relhasrules OR relhastriggers OR relrowsecurity))
	AND NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent IN ('lethe.catalog_epoch'::regclass, 'lethe.content_indexes'::regclass, 'lethe.lineage_tables'::regclass,
				'lethe.content_sources'::regclass, 'lethe.source_columns'::regclass))
	AND NOT EXISTS (
		WITH tmp(cls, oid) AS (
			SELECT 'pg_class'::regclass, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname LIKE 'pg\_temp\_%'
			UNION ALL SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname LIKE 'pg\_temp\_%'
			UNION ALL SELECT 'pg_type'::regclass, t.oid FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname LIKE 'pg\_temp\_%'),
		permanent(oid) AS (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname NOT LIKE 'pg\_temp\_%' AND n.nspname NOT LIKE 'pg\_toast\_temp\_%')
		SELECT 1 FROM pg_depend d JOIN tmp ON tmp.cls = d.refclassid AND tmp.oid = d.refobjid
		WHERE (d.classid = 'pg_class'::regclass AND d.objid IN (SELECT oid FROM permanent))
		   OR (d.classid = 'pg_trigger'::regclass AND EXISTS (SELECT 1 FROM pg_trigger g WHERE g.oid = d.objid AND g.tgrelid IN (SELECT oid FROM permanent)))
		   OR (d.classid = 'pg_constraint'::regclass AND EXISTS (SELECT 1 FROM pg_constraint k WHERE k.oid = d.objid AND k.conrelid IN (SELECT oid FROM permanent)))
		   OR (d.classid = 'pg_policy'::regclass AND EXISTS (SELECT 1 FROM pg_policy y WHERE y.oid = d.objid AND y.polrelid IN (SELECT oid FROM permanent))))`

// errCatalogMoved is the catalog changing while the long way audited it,
// or between the audit and the layout it read: it audits again.
var errCatalogMoved = errors.New("the catalog changed during the deletion's schema audit")

// catalogMoved reports whether the long way should audit again: the
// catalog moved during its audit, or its last statement found the epoch it
// audited under replaced (LE004).
func catalogMoved(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, errCatalogMoved) || (errors.As(err, &pgErr) && pgErr.Code == sqlStateBatchGuard)
}

// errShortWayClosed declines a batch before it starts: the layout of the
// audited epoch is gone, or the ledger does not record the layout its
// content rows were written from (migration 00018 not applied).
var errShortWayClosed = errors.New("the short way is closed")

// sqlStateBatchGuard is lethe.require_batch's SQLSTATE.
const sqlStateBatchGuard = "LE004"

// eligibleCTEs are the guard's two steps (see eligibleSQL) with the request
// uid, the sessions and the tenant at the placeholders given.
func eligibleCTEs(l Layout, uid, ids, tenant string) string {
	return `l AS MATERIALIZED (
			SELECT record_id, layout_digest FROM lethe.erasure_ledger
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
// unless the catalog epoch is $4, every session's content and source rows
// were written from a layout of digest $5 (the one the batch acts on;
// migration 00018), and every one of the sessions $2, each once, is
// eligible ($1 the request, $3 the tenant): the later statements of the
// pipeline then work on exactly the locked sessions. more is added to its
// select list ("" or starting with a comma).
func batchGuardSQL(l Layout, more string) string {
	return `WITH ` + eligibleCTEs(l, "$1", "$2", "$3") + `
		SELECT lethe.require_batch(` + catalogEpochExpr + ` = $4
				AND NOT EXISTS (SELECT 1 FROM l WHERE l.layout_digest IS DISTINCT FROM $5::text),
			(SELECT count(DISTINCT s.id) FROM s) = cardinality($2::text[]))` + more
}

// epochStillSQL raises LE004 unless the epoch is still $1, at the end of
// the pipeline: a DDL command that committed while the deletes waited for
// a lock rolls the batch back.
const epochStillSQL = `SELECT lethe.require_batch(` + catalogEpochExpr + ` = $1, true)`

// declined reports whether the short way failed at a guard — closed before
// it started (errShortWayClosed), refused (LE004; the message names the
// epoch for a layout digest refused too), or unable to run (migration 00013
// or 00018 reverted): the transaction rolls back and the long way runs and
// reports what is wrong, if anything is. Any other error is the batch's.
func declined(err error) bool {
	if errors.Is(err, errShortWayClosed) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case sqlStateBatchGuard, "42883", "42P01", "42703": // undefined function, table, column (00018's reverted)
		return true
	}
	return false
}

// AuditMemo remembers, for one database schema, what the long way learnt:
// the epoch around its last compliant audit, and a layout with the epoch
// it was read under. The Erasers of a store share one (Pools.Memo), so
// both outlive a pass; a memo is for one pool (a rotated DSN resets it).
// The Erasers also share their post-deletion vacuums through it.
type AuditMemo struct {
	vacuums vacuumQueue

	mu          sync.Mutex
	pool        DB
	compliant   string
	layout      *Layout
	layoutEpoch string
	// vectors are the database's vector columns (every schema), read
	// under the catalog epoch vectorsEpoch: the residue probes' targets.
	vectors      []vectorColumn
	vectorsEpoch string
}

// forPool resets the memo when it was made for another pool; m.mu is held.
func (m *AuditMemo) forPool(p DB) {
	if m.pool != p {
		m.pool, m.compliant, m.layout, m.layoutEpoch = p, "", nil, ""
		m.vectors, m.vectorsEpoch = nil, ""
	}
}

// readEpoch reads the catalog epoch, "" when there is none (no enabled
// event trigger, migration 00013 not applied). Inside a transaction it
// reads under a savepoint, leaving the transaction usable.
func readEpoch(ctx context.Context, q Querier) string {
	var d *string
	read := func(q Querier) error { return q.QueryRow(ctx, catalogEpochSQL).Scan(&d) }
	if tx, inTx := q.(pgx.Tx); inTx {
		if underSavepoint(ctx, tx, read) != nil || d == nil {
			return ""
		}
		return *d
	}
	if read(q) != nil || d == nil {
		return ""
	}
	return *d
}

// mechanismIntact runs mechanismIntactSQL in tx (under a savepoint).
func mechanismIntact(ctx context.Context, tx pgx.Tx) bool {
	var ok bool
	err := underSavepoint(ctx, tx, func(q Querier) error {
		return q.QueryRow(ctx, mechanismIntactSQL, bumpCatalogEpochBody, catalogChangedBody, registryChangedBody).Scan(&ok)
	})
	return err == nil && ok
}

// underSavepoint runs read in tx under a savepoint, so that a read that
// fails (an object 00013 adds is missing) leaves tx usable.
func underSavepoint(ctx context.Context, tx pgx.Tx, read func(Querier) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if err := read(sp); err != nil {
		_ = sp.Rollback(ctx)
		return err
	}
	return sp.Commit(ctx)
}

// shortWayEpoch is the epoch a batch may take the short way under: the
// one the last compliant audit read, if the Eraser's layout was read under
// it too; "" when there is none. It takes the two locks one after the
// other, never nested (layout nests them Eraser first).
func (e *Eraser) shortWayEpoch() string {
	m := e.memo()
	e.mu.Lock()
	layoutEpoch := e.layoutEpoch
	e.mu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.compliant == "" || m.compliant != layoutEpoch {
		return ""
	}
	return m.compliant
}

// guardSchemaRemembered is guardSchema, remembering the catalog epoch when
// the audit passes, the token's machinery is intact and the epoch read the
// same before and after (a change committed meanwhile is not taken as
// audited). It returns the epoch it remembered: "" when there is none (no
// machinery), errCatalogMoved when the epoch changed during the audit.
func (e *Eraser) guardSchemaRemembered(ctx context.Context, tx pgx.Tx) (string, error) {
	before := readEpoch(ctx, tx)
	if err := guardSchema(ctx, tx, e.Schema); err != nil {
		e.remember("")
		return "", err
	}
	if before == "" || !mechanismIntact(ctx, tx) {
		e.remember("")
		return "", nil
	}
	if after := readEpoch(ctx, tx); after != before {
		return "", errCatalogMoved
	}
	e.remember(before)
	return before, nil
}

// auditedLayout audits the schema in tx (guardSchemaRemembered) and returns
// the layout to act on in it with the epoch it was audited under ("" when
// there is no epoch to audit under): the Eraser's layout when it was read
// under that epoch, else the layout read again in tx, after the audit,
// which must be read under it too. A layout is read by several statements,
// each with its own snapshot, and kept for the Eraser's life: one read
// while the catalog changed (a pg_restore adds the keys to sessions one by
// one, and grants the privileges only after all of them) can miss a
// cascading table, and the deletion would then miss its content hashes:
// the content-keyed entries of that table's rows would stay, with no
// ledger row, for good. errCatalogMoved: the catalog changed during the
// audit or between it and the read; the caller audits again.
//
// Settling (the last of auditAttempts), a moved catalog is not an error:
// the layout read after the audit is returned with no epoch, as where
// there is no event trigger, so that a steady stream of DDL cannot starve
// the deletion.
func (e *Eraser) auditedLayout(ctx context.Context, tx pgx.Tx, settle bool) (Layout, string, error) {
	audited, err := e.guardSchemaRemembered(ctx, tx)
	if settle && errors.Is(err, errCatalogMoved) {
		audited, err = "", nil
	}
	if err != nil {
		return Layout{}, "", err
	}
	if audited != "" {
		if l, ok := e.layoutUnder(audited); ok {
			return l, audited, nil
		}
	}
	e.mu.Lock()
	e.loaded, e.layoutEpoch = nil, ""
	e.mu.Unlock()
	l, read, err := e.layoutAndEpoch(ctx, tx)
	if err != nil {
		return l, "", err
	}
	if audited != "" && read != audited {
		if settle {
			return l, "", nil
		}
		return l, "", errCatalogMoved
	}
	return l, audited, nil
}

// longWayAttempts bounds the long way's audits of one transaction.
const longWayAttempts = 3

// auditAttempts runs attempt (a long-way transaction: its own audit, its
// work, the audited epoch checked at its end) again while the catalog
// moves under it, after a short jittered pause; the last attempt settles
// (auditedLayout).
func auditAttempts(ctx context.Context, attempt func(settle bool) error) error {
	var err error
	for i := range longWayAttempts {
		if i > 0 {
			pause := time.Duration(10<<(2*i)) * time.Millisecond
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pause/2 + rand.N(pause)):
			}
		}
		if err = attempt(i == longWayAttempts-1); !catalogMoved(err) {
			return err
		}
	}
	return err
}

// layoutUnder is the Eraser's layout if it was read under epoch.
func (e *Eraser) layoutUnder(epoch string) (Layout, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loaded == nil || e.layoutEpoch != epoch {
		return Layout{}, false
	}
	return *e.loaded, true
}

// remember sets the memo's compliant epoch.
func (e *Eraser) remember(epoch string) {
	m := e.memo()
	m.mu.Lock()
	m.compliant = epoch
	m.mu.Unlock()
}
