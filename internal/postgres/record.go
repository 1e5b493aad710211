package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// The store's record (kept in the API server, see internal/storerecord)
// outlives the request objects; these read and restore the database against
// it. It names sessions by keyed hashes only, so a resurrected session is
// found by hashing the IDs the database holds.

const (
	// sourceLedgerSQL lists the keyed source hashes the request $1 holds,
	// with the key they are under (empty when none says).
	sourceLedgerSQL = `SELECT coalesce(max(key_id), ''), coalesce(array_agg(record_id ORDER BY record_id), '{}') FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'source' AND cancelled_at IS NULL`
	// recordedSQL compares, per request $1 with $2 sessions and $3 sources
	// recorded, the ledger's erased session rows and source rows: what is
	// missing, and how many of the sessions its rows name exist again.
	recordedSQL = `SELECT r.uid,
		(SELECT count(*) FROM lethe.erasure_ledger l WHERE l.request_uid = r.uid AND l.scope = 'session'
			AND EXISTS (SELECT 1 FROM %[1]s s WHERE s.id = l.record_id::uuid)),
		greatest(0, r.sessions - (SELECT count(*) FROM lethe.erasure_ledger l
			WHERE l.request_uid = r.uid AND l.scope = 'session' AND l.erased_at IS NOT NULL))
		+ greatest(0, r.sources - (SELECT count(*) FROM lethe.erasure_ledger l
			WHERE l.request_uid = r.uid AND l.scope = 'source' AND l.cancelled_at IS NULL))
		FROM unnest($1::text[], $2::int[], $3::int[]) AS r(uid, sessions, sources)`
	// restoreSourcesSQL re-creates the source rows $1 of the request $2,
	// under the key $4 the record says (NULL: unknown).
	restoreSourcesSQL = `WITH i AS (
		INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, erased_at, key_id)
		SELECT 'source', r, $2, $3, now(), now(), now(), nullif($4, '') FROM unnest($1::text[]) AS r
		ON CONFLICT DO NOTHING RETURNING 1)
		SELECT count(*) FROM i`
	// underOtherKeysSQL counts the requests holding keyed rows in force
	// under another key than $1 (the database's), by the partial index,
	// among the first 10,000 such rows: a database whose key changed has
	// its whole keyed ledger there, and the audit's time is bounded.
	underOtherKeysSQL = `SELECT count(DISTINCT request_uid) FROM (SELECT request_uid FROM lethe.erasure_ledger
		WHERE (key_id < $1 OR key_id > $1) AND cancelled_at IS NULL LIMIT 10000) s`
)

// SourceHashes lists the keyed hashes of the sources the request uid
// erased, and the fingerprint (lethe.erasure_key_id) of the erasure key
// their ledger rows say they are under; empty when none says.
func (e *Eraser) SourceHashes(ctx context.Context, uid string) (hashes []string, keyID string, err error) {
	err = e.Pool.QueryRow(ctx, sourceLedgerSQL, uid).Scan(&keyID, &hashes)
	return hashes, keyID, err
}

// UnderOtherKeys counts the requests whose keyed ledger rows in force are
// under another erasure key than the database's (every one that says its
// key, when the database has none): the database matches none of them.
// Rows that do not say their key are not counted; past 10,000 such rows
// the count is of the requests among the first 10,000.
func (e *Eraser) UnderOtherKeys(ctx context.Context) (int64, error) {
	id, err := e.ErasureKeyID(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	err = e.Pool.QueryRow(ctx, underOtherKeysSQL, id).Scan(&n)
	return n, err
}

// ErasureKeyID is the fingerprint of the database's erasure key, under
// which every keyed hash in the ledger is taken; empty when it has none.
func (e *Eraser) ErasureKeyID(ctx context.Context) (string, error) {
	var id string
	err := e.Pool.QueryRow(ctx, `SELECT coalesce(lethe.erasure_key_id(), '')`).Scan(&id)
	return id, err
}

// CheckRecorded reports the recorded requests whose erasure the database no
// longer holds in full: erased ledger rows or source rows fewer than
// recorded (a restore took them), or sessions of its ledger rows that exist
// again. Read only.
func (e *Eraser) CheckRecorded(ctx context.Context, recs []erasure.Recorded) ([]erasure.RestoreFinding, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	uids := make([]string, len(recs))
	sessions, sources := make([]int32, len(recs)), make([]int32, len(recs))
	for i, r := range recs {
		uids[i], sessions[i], sources[i] = r.UID, int32(r.Sessions), int32(len(r.Sources))
	}
	var out []erasure.RestoreFinding
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		rows, err := tx.Query(ctx, fmt.Sprintf(recordedSQL, l.Sessions.Ident()), uids, sessions, sources)
		if err != nil {
			return fmt.Errorf("check recorded erasures: %w", err)
		}
		var f erasure.RestoreFinding
		_, err = pgx.ForEachRow(rows, []any{&f.UID, &f.SessionsBack, &f.LedgerRowsMissing}, func() error {
			if f.SessionsBack > 0 || f.LedgerRowsMissing > 0 {
				out = append(out, f)
			}
			return nil
		})
		return err
	})
	return out, err
}

// MatchSessions streams the IDs of the store's sessions (of its tenant) and
// returns, sorted, those match accepts: it reads every session ID, and is
// run only once a restore has been detected.
func (e *Eraser) MatchSessions(ctx context.Context, match func(sessionID string) bool) ([]string, error) {
	var out []string
	err := e.inTx(ctx, readOnly, func(tx pgx.Tx, l Layout) error {
		rows, err := tx.Query(ctx, `SELECT id::text FROM `+l.Sessions.Ident()+` WHERE ($1::text IS NULL OR tenant_id = $1) ORDER BY id`, e.tenant())
		if err != nil {
			return fmt.Errorf("list sessions: %w", err)
		}
		var id string
		_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
			if match(id) {
				out = append(out, id)
			}
			return nil
		})
		return err
	})
	return out, err
}

// RestoreSources re-creates, in force, the source rows of the request uid
// that a restore took away, so that re-ingestion is refused again, under
// the key keyID they were taken under (empty: unknown); it returns how
// many it wrote.
func (e *Eraser) RestoreSources(ctx context.Context, uid string, hashes []string, keyID string) (int64, error) {
	var n int64
	if len(hashes) == 0 {
		return 0, nil
	}
	err := e.Pool.QueryRow(ctx, restoreSourcesSQL, hashes, uid, e.tenant(), keyID).Scan(&n)
	return n, err
}

// erasedElsewhereSQL lists the sessions some request other than $1 holds
// erased whose session no longer exists.
func erasedElsewhereSQL(l Table) string {
	return `SELECT DISTINCT l.record_id FROM lethe.erasure_ledger l
		WHERE l.scope = 'session' AND l.erased_at IS NOT NULL AND l.request_uid <> $1
		  AND NOT EXISTS (SELECT 1 FROM ` + l.Ident() + ` s WHERE s.id = l.record_id::uuid)`
}

// markErasedForSQL writes erased ledger rows of the request $2 for the sessions $1.
const markErasedForSQL = `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, erased_at)
	SELECT 'session', r, $2, $3, now(), now(), now() FROM unnest($1::text[]) AS r ON CONFLICT DO NOTHING`

// RecordErasedElsewhere writes, erased, the ledger rows of the recorded
// request uid for its sessions (those match accepts) that another request
// erased again first: overlapping requests share sessions, and the record
// of a deleted request would otherwise stay short of its rows for ever.
func (e *Eraser) RecordErasedElsewhere(ctx context.Context, uid string, match func(sessionID string) bool) error {
	ids, err := collectStrings(ctx, e.Pool, erasedElsewhereSQL(e.sessions()), uid)
	if err != nil {
		return fmt.Errorf("list sessions erased by other requests: %w", err)
	}
	var mine []string
	for _, id := range ids {
		if match(id) {
			mine = append(mine, id)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	_, err = e.Pool.Exec(ctx, markErasedForSQL, mine, uid, e.tenant())
	return err
}

// erasedRequestsSQL lists the requests that erased a session, of the
// tenant $1 (NULL: any). It walks the ledger's primary key one request at
// a time: a probe for the next request, one for the tenant of one of its
// rows (the rows a request's own store writes all carry its tenant), and,
// for the tenant's, one until an erased session row. It never reads every
// session row of the ledger, only those of the tenant's requests that
// erased none (cancelled, in their grace period).
const erasedRequestsSQL = `WITH RECURSIVE u(uid) AS (
		SELECT min(request_uid) FROM lethe.erasure_ledger
		UNION ALL
		SELECT (SELECT min(l.request_uid) FROM lethe.erasure_ledger l WHERE l.request_uid > u.uid) FROM u WHERE u.uid IS NOT NULL)
	SELECT u.uid FROM u WHERE u.uid IS NOT NULL
	  AND ($1::text IS NULL OR (SELECT l.tenant_id FROM lethe.erasure_ledger l WHERE l.request_uid = u.uid LIMIT 1) = $1)
	  AND EXISTS (SELECT 1 FROM lethe.erasure_ledger l WHERE l.request_uid = u.uid AND l.scope = 'session' AND l.erased_at IS NOT NULL)`

// ErasedRequests lists the requests that erased sessions of the store's
// tenant, sorted: the store's record must hold each one whose request
// object is gone. Read only.
func (e *Eraser) ErasedRequests(ctx context.Context) ([]string, error) {
	uids, err := collectStrings(ctx, e.Pool, erasedRequestsSQL, e.tenant())
	if err != nil {
		return nil, fmt.Errorf("list the requests that erased sessions: %w", err)
	}
	return uids, nil
}

// LedgerErasure is what the ledger holds of one request's erasure.
type LedgerErasure struct {
	UID string
	// Held counts its session rows neither erased nor cancelled.
	Held int64
	// DeletedAt is its latest session erasure (zero: none).
	DeletedAt time.Time
	// Sessions are the sessions it erased, sorted.
	Sessions []string
	// Sources are its keyed source hashes in force, sorted, under the key
	// SourcesKey says (empty: unknown).
	Sources    []string
	SourcesKey string
}

// ledgerErasuresSQL reads, for each request of $1, what heldBySQL,
// deletedAtSQL, erasedSessionsSQL and sourceLedgerSQL read of one.
const ledgerErasuresSQL = `SELECT u.uid,
		(SELECT count(*) FROM lethe.erasure_ledger l WHERE l.request_uid = u.uid AND l.scope = 'session'
			AND l.erased_at IS NULL AND l.cancelled_at IS NULL),
		(SELECT max(l.erased_at) FROM lethe.erasure_ledger l WHERE l.request_uid = u.uid AND l.scope = 'session'),
		(SELECT coalesce(array_agg(l.record_id ORDER BY l.record_id), '{}') FROM lethe.erasure_ledger l
			WHERE l.request_uid = u.uid AND l.scope = 'session' AND l.erased_at IS NOT NULL),
		(SELECT coalesce(max(l.key_id), '') FROM lethe.erasure_ledger l
			WHERE l.request_uid = u.uid AND l.scope = 'source' AND l.cancelled_at IS NULL),
		(SELECT coalesce(array_agg(l.record_id ORDER BY l.record_id), '{}') FROM lethe.erasure_ledger l
			WHERE l.request_uid = u.uid AND l.scope = 'source' AND l.cancelled_at IS NULL)
	FROM unnest($1::text[]) WITH ORDINALITY AS u(uid, n) ORDER BY u.n`

// LedgerErasures reads what the ledger holds of each request of uids, in
// their order, in one statement. Read only.
func (e *Eraser) LedgerErasures(ctx context.Context, uids []string) ([]LedgerErasure, error) {
	rows, err := e.Pool.Query(ctx, ledgerErasuresSQL, uids)
	if err != nil {
		return nil, fmt.Errorf("read the ledger's erasures: %w", err)
	}
	var out []LedgerErasure
	var le LedgerErasure
	var at *time.Time
	_, err = pgx.ForEachRow(rows, []any{&le.UID, &le.Held, &at, &le.Sessions, &le.SourcesKey, &le.Sources}, func() error {
		le.DeletedAt = time.Time{}
		if at != nil {
			le.DeletedAt = *at
		}
		// The scan targets are reused: keep copies.
		c := le
		c.Sessions, c.Sources = slices.Clone(le.Sessions), slices.Clone(le.Sources)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the ledger's erasures: %w", err)
	}
	return out, nil
}
