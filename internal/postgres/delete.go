package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgvector/pgvector-go"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// analyzeLedgerWithoutStatisticsSQL analyzes the ledger if it has no column
// statistics (a new database, or one pg_restore just wrote: it carries
// none, though its index builds set pg_class.reltuples) and the role may
// analyze it (has its owner's privileges, as a superuser does; else the
// server would only warn). The role check comes first, in its own IF: it is
// one catalog lookup, where pg_stats filters every column statistic of the
// database by privilege (tens of milliseconds in a large one), and a
// manager that does not own the ledger need not pay for it.
// Without statistics the planner reads the batch statements' record_id =
// ANY(...) as a filter over every ledger row of the request, not as a key
// lookup per session: each batch of a request of 160,000 sessions then
// read all of its rows (28 ms a statement against 0.7 ms), work quadratic
// in the request's size until autovacuum analyzes.
const analyzeLedgerWithoutStatisticsSQL = `DO $$BEGIN
	IF pg_has_role((SELECT relowner FROM pg_class WHERE oid = 'lethe.erasure_ledger'::regclass), 'USAGE') THEN
		IF NOT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = 'lethe' AND tablename = 'erasure_ledger') THEN
			PERFORM set_config('lock_timeout', '1s', true);
			ANALYZE lethe.erasure_ledger;
		END IF;
	END IF;
END$$`

// analyzeLedgerIfWithoutStatistics runs analyzeLedgerWithoutStatisticsSQL before a
// deletion of more than one batch (one batch reads the request's rows once
// whatever the plan). Its failure is not the deletion's: the statements are
// right under any plan, and a lock held by a running (auto)analyze gives
// up after a second.
func (e *Eraser) analyzeLedgerIfWithoutStatistics(ctx context.Context) {
	_, _ = e.Pool.Exec(ctx, analyzeLedgerWithoutStatisticsSQL)
}

// walPositionSQL reads the WAL position after the last commit (flushed:
// the pools commit with synchronous_commit on).
const walPositionSQL = `SELECT pg_current_wal_lsn()::text`

// positionErasedSQL dates the request $1's sessions still provisional (a
// manager died between their batch's commit and its dating; a re-erasure
// just committed), as afterCommitSQL does, and reads the WAL position and
// the request's latest erased_at in one statement: its snapshot precedes
// the position, so no erasure that commits after the position counts in
// the time (what the replica wait keys on must never run ahead of the
// position it keeps). Its own dating commits after the position: a
// ledger-only change to sessions whose erasure committed before it.
const positionErasedSQL = `WITH u AS (` + dateSQL + `erased_at_provisional RETURNING erased_at)
	SELECT pg_current_wal_lsn()::text, greatest((SELECT max(erased_at) FROM u), (SELECT max(erased_at) FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL))`

// Delete erases the request's sessions in batches of batchSize, one
// transaction each. Each transaction re-checks the ledger — not cancelled,
// grace elapsed by the database's clock, tenant — removes content-index
// entries and derived records of the sessions, deletes the sessions (the
// cascade takes the rest), marks the ledger erased and writes the receipt
// for (request, Deleted, batch), its digest that of the batch's result. A
// repeat skips the batches already done. It keeps at most probeBudget of
// the erased embeddings and min(probeBudget, TextProbeBudget) passages of
// their text, in memory only, for the residue probes, and the content
// hashes of what it erased (erasure.ContentKeys), for Verify.
func (e *Eraser) Delete(ctx context.Context, req erasure.Request, batchSize, probeBudget int) (erasure.DeleteResult, error) {
	var out erasure.DeleteResult
	if batchSize < 1 {
		return out, errors.New("the deletion batch size must be at least 1")
	}
	// The layout first, outside any transaction: whether a batch may take
	// the short way depends on the epoch it was read under.
	if _, err := e.layout(ctx, e.Pool); err != nil {
		return out, err
	}
	ids := slices.Clone(req.SessionIDs)
	slices.Sort(ids)
	if len(ids) > batchSize {
		e.analyzeLedgerIfWithoutStatistics(ctx)
	}
	textBudget := min(probeBudget, erasure.TextProbeBudget)
	out.ContentKeys = erasure.ContentKeys{}
	b := 0
	last := (len(ids) - 1) / batchSize
	for chunk := range slices.Chunk(ids, batchSize) {
		res, sample, err := e.deleteBatch(ctx, req.UID, b, chunk,
			sampleBudget{embeddings: probeBudget - len(out.Probe), texts: textBudget - len(out.Texts)})
		if err != nil {
			return out, fmt.Errorf("batch %d: %w", b, err)
		}
		if err := e.dateBatch(ctx, req.UID, sample.erased, b == last, &out); err != nil {
			return out, fmt.Errorf("batch %d: %w", b, err)
		}
		out.Batches = append(out.Batches, res)
		out.Probe = append(out.Probe, sample.embeddings...)
		out.TextRows += sample.textRows
		out.ContentKeys = keepContentKeys(out.ContentKeys, sample.contentKeys, sample.tooManyKeys)
		for _, t := range sample.texts {
			// The same passage twice (a text said twice) is probed once.
			if !slices.Contains(out.Texts, t) {
				out.Texts = append(out.Texts, t)
			}
		}
		b++
	}
	if out.CommitLSN != "" {
		return out, nil
	}
	// The last batch erased nothing (done before, or marking sessions
	// already gone; it may have moved the ledger's erased_at: markGoneSQL):
	// the position now is past every batch's commit.
	var err error
	out.CommitLSN, out.ErasedAt, err = e.positionErased(ctx, req.UID)
	return out, err
}

// keepContentKeys adds a batch's content hashes to those kept, within
// erasure.MaxContentKeys; past it (or when the batch had too many to read
// them), none are kept (nil) from then on.
func keepContentKeys(kept erasure.ContentKeys, batch []string, tooMany bool) erasure.ContentKeys {
	if kept == nil || tooMany || len(kept)+len(batch) > erasure.MaxContentKeys {
		return nil
	}
	return append(kept, batch...)
}

// positionErased dates the request's provisional sessions and reads the
// WAL position now and the request's latest erased_at (positionErasedSQL).
func (e *Eraser) positionErased(ctx context.Context, uid string) (string, time.Time, error) {
	var lsn string
	var erasedAt *time.Time
	if err := e.Pool.QueryRow(ctx, positionErasedSQL, uid).Scan(&lsn, &erasedAt); err != nil {
		return "", time.Time{}, fmt.Errorf("read WAL position: %w", err)
	}
	if erasedAt == nil {
		return lsn, time.Time{}, nil
	}
	return lsn, *erasedAt, nil
}

// afterCommitSQL moves the erased_at of the sessions $2 of the request $1
// to now, once their batch committed: a synchronous commit can wait on a
// standby after the batch's last statement, and a backup that started
// meanwhile still read the sessions. Later is the safe direction. So it
// does for the request's sessions still provisional: an earlier batch's
// dating that a dead manager never ran. It returns the WAL position, past
// the batch's commit, for the replica wait, and the request's latest
// erased_at as positionErasedSQL does, but for its own update, which
// commits after the position: a ledger-only change to sessions whose
// deletion committed before the position (a provisional row is read only
// once its batch committed), so a replica that replayed to it serves none
// of their rows.
const afterCommitSQL = `WITH u AS (` + dateSQL + `(record_id = ANY($2::text[]) OR erased_at_provisional) RETURNING erased_at)
	SELECT pg_current_wal_lsn()::text, greatest((SELECT max(erased_at) FROM u), (SELECT max(erased_at) FROM lethe.erasure_ledger
		WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL))`

// dateBatch dates the sessions a batch erased by the end of its commit.
// After the last batch, if it erased any, it also reads into out the
// position and the request's latest erased_at (afterCommit); reading them
// after every batch would read every ledger row of the request once per
// batch.
func (e *Eraser) dateBatch(ctx context.Context, uid string, erased []string, last bool, out *erasure.DeleteResult) error {
	switch {
	case len(erased) == 0:
		return nil
	case !last:
		return e.redate(ctx, uid, erased)
	}
	var err error
	out.CommitLSN, out.ErasedAt, err = e.afterCommit(ctx, uid, erased)
	return err
}

// dateSQL, completed by a condition, moves the erased_at of the request
// $1's erased sessions to now, unless later, and makes it final.
const dateSQL = `UPDATE lethe.erasure_ledger SET erased_at = greatest(erased_at, clock_timestamp()), erased_at_provisional = NULL
	WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL AND `

// redateSQL moves the erased_at of the sessions $2 of the request $1 to
// now: the dating after the commit of a batch that is not the last.
const redateSQL = dateSQL + `record_id = ANY($2::text[])`

// redate dates the sessions a batch erased by the end of its commit.
func (e *Eraser) redate(ctx context.Context, uid string, erased []string) error {
	if _, err := e.Pool.Exec(ctx, redateSQL, uid, erased); err != nil {
		return fmt.Errorf("date the deletion by its commit: %w", err)
	}
	return nil
}

// afterCommit dates the sessions a batch erased by the end of its commit
// and returns the WAL position after it, with the request's latest
// erased_at no later than that position.
func (e *Eraser) afterCommit(ctx context.Context, uid string, erased []string) (string, time.Time, error) {
	var lsn string
	var erasedAt *time.Time
	if err := e.Pool.QueryRow(ctx, afterCommitSQL, uid, erased).Scan(&lsn, &erasedAt); err != nil {
		return "", time.Time{}, fmt.Errorf("date the deletion by its commit: %w", err)
	}
	if erasedAt == nil {
		return lsn, time.Time{}, nil
	}
	return lsn, *erasedAt, nil
}

// eligibleSQL is the guard: of the sessions $2, those the request $1 holds
// tombstoned, not cancelled, not yet erased, past the grace period by the
// database's clock, and of the tenant $3 (NULL: any). It locks both rows.
// Two steps, each on its table's key, so that no plan (generic or custom)
// walks the tombstoned sessions: the ledger rows first, then the sessions
// they name.
func eligibleSQL(l Layout) string {
	return `WITH l AS MATERIALIZED (
			SELECT record_id FROM lethe.erasure_ledger
			WHERE request_uid = $1 AND scope = 'session' AND record_id = ANY($2::text[])
			  AND cancelled_at IS NULL AND erased_at IS NULL AND grace_ends_at <= now()
			FOR UPDATE)
		SELECT s.id::text FROM ` + l.Sessions.Ident() + ` s
		WHERE s.id = ANY(ARRAY(SELECT record_id::uuid FROM l))
		  AND s.tombstoned_at IS NOT NULL AND ($3::text IS NULL OR s.tenant_id = $3)
		ORDER BY s.id FOR UPDATE`
}

// markGoneSQL marks erased the request $1's eligible ledger rows of the
// sessions $2 whose session no longer exists.
func markGoneSQL(l Layout) string {
	return `UPDATE lethe.erasure_ledger l SET erased_at = clock_timestamp()
		WHERE l.request_uid = $1 AND l.scope = 'session' AND l.record_id = ANY($2::text[])
		  AND l.cancelled_at IS NULL AND l.erased_at IS NULL AND l.grace_ends_at <= now()
		  AND NOT EXISTS (SELECT 1 FROM ` + l.Sessions.Ident() + ` s WHERE s.id = l.record_id::uuid)`
}

// sampleBudget bounds what a batch samples for the residue probes.
type sampleBudget struct{ embeddings, texts int }

// batchSample is what a batch sampled for the residue probes, before its
// deletes, kept in memory only.
type batchSample struct {
	// erased are the sessions the batch erased (not sampled: its result).
	erased     []string
	embeddings []erasure.Embedding
	// contentKeys are the content hashes of the sessions, read by the
	// first content index's delete (nil without a content index);
	// tooManyKeys: not sent (deleteContentSQL).
	contentKeys []string
	tooManyKeys bool
	texts       []erasure.TextSample
	textRows    int64
}

// deleteBatch erases one batch, the short way when the catalog is the one
// last audited compliant, the whole batch is eligible and its content rows
// were written from the layout the batch acts on, else the long way
// (batchguard.go).
func (e *Eraser) deleteBatch(ctx context.Context, uid string, batch int, ids []string, budget sampleBudget) (erasure.BatchResult, batchSample, error) {
	if epoch := e.shortWayEpoch(); epoch != "" {
		res, sample, err := e.deleteBatchShort(ctx, uid, batch, ids, budget, epoch)
		if err == nil {
			e.ways.short.Add(1)
			return res, sample, nil
		}
		if !declined(err) {
			return res, sample, err
		}
		e.ways.declined.Add(1)
	}
	var res erasure.BatchResult
	var sample batchSample
	err := auditAttempts(ctx, func(settle bool) error {
		var err error
		res, sample, err = e.deleteBatchLong(ctx, uid, batch, ids, budget, settle)
		return err
	})
	if err == nil {
		e.ways.long.Add(1)
	}
	return res, sample, err
}

// deleteBatchShort sends the guard and the whole deletion in one pipeline,
// then the receipt, then the commit.
func (e *Eraser) deleteBatchShort(ctx context.Context, uid string, batch int, ids []string, budget sampleBudget,
	epoch string) (erasure.BatchResult, batchSample, error) {
	res := erasure.BatchResult{Batch: batch}
	var sample *batchSample
	l, ok := e.layoutUnder(epoch)
	if !ok || !l.LedgerTagsLayout {
		return res, batchSample{}, errShortWayClosed
	}
	err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var p pipeline
		sample = queueErase(&p, l, uid, ids, e.tenant(), budget, &res, eraseChecks{guard: true, epoch: epoch})
		if err := p.send(ctx, tx); err != nil {
			return err
		}
		return e.finishBatch(ctx, tx, l, uid, batch, ids, budget, &res, sample)
	})
	if err != nil {
		return res, batchSample{}, err
	}
	return res, *sample, nil
}

// deleteBatchLong audits the schema in the transaction, finds the eligible
// sessions, marks those already gone and deletes the rest.
func (e *Eraser) deleteBatchLong(ctx context.Context, uid string, batch int, ids []string, budget sampleBudget,
	settle bool) (erasure.BatchResult, batchSample, error) {
	res := erasure.BatchResult{Batch: batch}
	var sample *batchSample
	err := pgx.BeginTxFunc(ctx, e.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		l, epoch, err := e.auditedLayout(ctx, tx, settle)
		if err != nil {
			return err
		}
		eligible, err := collectStrings(ctx, tx, eligibleSQL(l), uid, ids, e.tenant())
		if err != nil {
			return fmt.Errorf("check ledger: %w", err)
		}
		if err := e.rewriteStaleContent(ctx, tx, l, uid, eligible); err != nil {
			return err
		}
		// A session of the batch already gone (another request holding it
		// erased it first) is erased for this request too: its ledger row
		// says so, so no later check takes it for a restore.
		if _, err := tx.Exec(ctx, markGoneSQL(l), uid, ids); err != nil {
			return fmt.Errorf("mark gone sessions erased: %w", err)
		}
		if len(eligible) == 0 {
			res.Skipped = true
			sample = &batchSample{}
			return tx.QueryRow(ctx, nowSQL).Scan(&res.DeletedAt)
		}
		// As on the short way, the last statement checks the epoch: a
		// registry change or DDL that committed after the audit rolls the
		// batch back (and the batch audits again; settling, it goes on:
		// auditAttempts).
		checks := eraseChecks{epoch: epoch}
		if settle {
			checks.epoch = ""
		}
		var p pipeline
		sample = queueErase(&p, l, uid, eligible, e.tenant(), budget, &res, checks)
		if err := p.send(ctx, tx); err != nil {
			return err
		}
		return e.finishBatch(ctx, tx, l, uid, batch, eligible, budget, &res, sample)
	})
	if err != nil {
		return res, batchSample{}, err
	}
	return res, *sample, nil
}

// finishBatch completes the sample and writes the batch's receipt, in its
// transaction. The receipt counts what the evidence reports, so a pass
// after a restart reports the batches done before it from the receipts.
func (e *Eraser) finishBatch(ctx context.Context, tx pgx.Tx, l Layout, uid string, batch int, erased []string, budget sampleBudget,
	res *erasure.BatchResult, sample *batchSample) error {
	sample.erased = erased
	if budget.texts > 0 {
		sample.textRows = textRows(l, res.Rows)
	}
	counts := append(slices.Clone(res.Rows),
		erasure.Count{Table: erasure.CountContentIndexEntries, Rows: res.ContentIndexEntries},
		erasure.Count{Table: erasure.CountDerivedRecords, Rows: res.DerivedRecords})
	return receipt{uid: uid, step: erasure.StepDeleted, batch: batch, sessions: res.Sessions, counts: counts, of: *res}.write(ctx, tx)
}

// eraseChecks are the guards queueErase folds into its first and last
// statements, so that they cost no statement of their own.
type eraseChecks struct {
	// guard: the first statement is the batch guard (batchGuardSQL) under
	// the epoch, which locks the sessions; else a statement run before
	// locked them.
	guard bool
	// epoch, when not "", is checked again by the last statement
	// (epochStillSQL): a DDL command that committed while the deletes
	// waited for a lock rolls the batch back.
	epoch string
}

// queueErase queues the removal of the sessions (locked by the guard, or
// by a statement run before) and everything reached from them:
// content-index entries (for the store's tenant, nil: every tenant),
// derived records, the sessions and, by cascade, their rows; and marks
// them erased in the ledger. The sample it returns fills, within budget,
// with their embeddings and text, read before the deletes, when the
// pipeline is sent.
func queueErase(p *pipeline, l Layout, uid string, sessions []string, tenant *string, budget sampleBudget,
	res *erasure.BatchResult, checks eraseChecks) *batchSample {
	res.Sessions = len(sessions)
	counters := newDeletionCounters(l)
	if checks.guard {
		counters.queueGuardAndBefore(p, l, uid, sessions, tenant, checks.epoch)
	} else {
		counters.queueBefore(p)
	}
	sample := &batchSample{}
	if budget.embeddings > 0 && len(l.Vectors) > 0 {
		p.query("sample embeddings", sampleEmbeddingsSQL(l), []any{sessions, budget.embeddings}, func(rows pgx.Rows) error {
			vs, err := pgx.CollectRows(rows, pgx.RowTo[pgvector.Vector])
			for _, v := range vs {
				sample.embeddings = append(sample.embeddings, erasure.Embedding(v.Slice()))
			}
			return err
		})
	}
	queueTextSample(p, l, sessions, budget.texts, sample)
	queueContentDeletes(p, l, sessions, tenant, res, sample)
	queueDerivedDeletes(p, l, sessions, res)
	queueSessionDeletes(p, l, sessions)
	counters.queueMarkErasedAndAfter(p, uid, sessions, checks.epoch, res)
	return sample
}

// sampleEmbeddingsSQL samples at most $2 embeddings of the sessions $1,
// from every vector column of the cascade.
func sampleEmbeddingsSQL(l Layout) string {
	sel := make([]string, len(l.Vectors))
	for i, v := range l.Vectors {
		sel[i] = `(SELECT ` + v.Ident() + `::vector FROM ` + v.Table.Ident() + ` WHERE ` + l.sessionKey(v.Table) +
			` = ANY($1::uuid[]) AND ` + v.Ident() + ` IS NOT NULL LIMIT $2)`
	}
	return `SELECT * FROM (` + strings.Join(sel, " UNION ALL ") + `) s LIMIT $2`
}

// deleteContentSQL removes, from a content-keyed table, the entries whose
// key is a content hash of the sessions $1 and returns how many it removed
// or changed. Where the table records tenants, an erasure for the tenant $2
// takes that tenant off an entry and deletes the entry once no tenant is
// left: another tenant's identical text stays. Without a tenant ($2 NULL),
// or on a table without tenants, every entry of the content goes. Their
// ledger rows keep hiding the hashes (lethe.is_erased_content) and are not
// marked one by one: that cost more than the cascade itself; the receipt
// counts them.
//
// With keys, it also returns the hashes it looked for (for Verify, which
// can then look them up by index: erasure.ContentKeys); it reads them
// anyway, but sending them costs about 2 µs each, as much as Verify's
// hashing of a content-index entry. So it sends them only when the table
// had at least as many entries (Verify hashes a smaller table whole), and
// never more than erasure.MaxContentKeys; otherwise NULL.
func deleteContentSQL(l Layout, idx ContentIndex, keys bool) string {
	sql := removeContentSQL(idx, `WITH h AS MATERIALIZED (`+sessionHashesSQL(l)+`),`, `i.`+idx.Ident()+` IN (SELECT h FROM h)`)
	if keys {
		sql += `, (SELECT CASE WHEN n.n <= ` + strconv.Itoa(erasure.MaxContentKeys) + `
				AND (SELECT count(*) FROM (SELECT FROM ` + idx.Table.Ident() + ` LIMIT n.n) e) >= n.n
			THEN ARRAY(SELECT h FROM h) END FROM (SELECT count(*) AS n FROM h) n)`
	}
	return sql
}

// removeContentSQL removes from idx the entries key selects (with: the
// statement's first CTEs, ending in a comma, or "WITH"), tenant $2 as
// deleteContentSQL says, returning how many it removed or changed as the
// first column of its last SELECT (which may take more).
func removeContentSQL(idx ContentIndex, with, key string) string {
	sql := with + `
		d AS (DELETE FROM ` + idx.Table.Ident() + ` i WHERE ` + key + onlyTenantLeft(idx) + ` RETURNING 1)`
	if !idx.TenantList {
		return sql + ` SELECT (SELECT count(*) FROM d)`
	}
	tenants := pgx.Identifier{idx.TenantColumn}.Sanitize()
	// Disjoint from d's rows: one statement must not change a row twice.
	return sql + `,
		u AS (UPDATE ` + idx.Table.Ident() + ` i SET ` + tenants + ` = array_remove(i.` + tenants + `, $2::text)
			WHERE ` + key + ` AND $2::text = ANY(i.` + tenants + `) AND NOT ` + idx.Tenants("i") + ` <@ ARRAY[$2::text] RETURNING 1)
		SELECT (SELECT count(*) FROM d) + (SELECT count(*) FROM u)`
}

// onlyTenantLeft restricts a deletion from idx to the entries that list no
// tenant but $2 (none at all, when $2 is NULL).
func onlyTenantLeft(idx ContentIndex) string {
	if idx.TenantColumn == "" {
		return ""
	}
	return ` AND ($2::text IS NULL OR ` + idx.Tenants("i") + ` <@ ARRAY[$2::text])`
}

// queueContentDeletes queues deleteContentSQL for each content index; the
// first also reads the content hashes into s.
func queueContentDeletes(p *pipeline, l Layout, eligible []string, tenant *string, res *erasure.BatchResult, s *batchSample) {
	if len(l.ContentSources) == 0 {
		return
	}
	for i, idx := range l.ContentIndexes {
		keys := i == 0
		p.queryRow("delete from "+idx.Table.String(), deleteContentSQL(l, idx, keys), contentArgs(idx, eligible, tenant), func(row pgx.Row) error {
			var n int64
			dest := []any{&n}
			if keys {
				dest = append(dest, &s.contentKeys)
			}
			err := row.Scan(dest...)
			res.ContentIndexEntries += n
			s.tooManyKeys = keys && s.contentKeys == nil
			return err
		})
	}
}

// deleteDerivedSQL deletes the derived records whose lineage names one of
// the sessions $1; their lineage rows go with them.
func deleteDerivedSQL(lin Lineage) string {
	return `WITH l AS (DELETE FROM ` + lin.Table.Ident() + ` WHERE ` + lin.SourceMatch(1) + `
			RETURNING ` + pgx.Identifier{lin.DerivedColumn}.Sanitize() + ` AS d)
		DELETE FROM ` + lin.Derived.Ident() + ` WHERE ` + pgx.Identifier{lin.DerivedKey}.Sanitize() + ` IN (SELECT d FROM l)`
}

func queueDerivedDeletes(p *pipeline, l Layout, eligible []string, res *erasure.BatchResult) {
	for _, lin := range l.Lineages {
		p.exec("delete derived records of "+lin.Derived.String(), deleteDerivedSQL(lin), []any{eligible}, func(tag pgconn.CommandTag) error {
			res.DerivedRecords += tag.RowsAffected()
			return nil
		})
	}
}

// deletedCountersExpr reads, per table of the array at the placeholder
// tables, the rows deleted by this connection's transactions, from its
// statistics counters (they include the cascade, and cost no second scan).
// Besides this transaction's rows they count those of earlier transactions
// of the connection that the backend has not yet flushed (PostgreSQL 15
// flushes at most once a second, when idle): a reading before the deletes
// and one after, in the same transaction, differ by exactly this
// transaction's rows.
func deletedCountersExpr(tables string) string {
	return `(SELECT array_agg(pg_stat_get_xact_tuples_deleted(to_regclass(t)) ORDER BY o)
		FROM unnest(` + tables + `::text[]) WITH ORDINALITY u(t, o))`
}

// deletionCounters reads the deletion counters of sessions and the tables
// cascading from it before and after the deletes.
type deletionCounters struct {
	tables []Table
	names  []string
	before []int64
}

func newDeletionCounters(l Layout) *deletionCounters {
	d := &deletionCounters{tables: l.cascading()}
	for _, t := range d.tables {
		d.names = append(d.names, t.Ident())
	}
	return d
}

// queueBefore reads the counters; it must come before any delete.
func (d *deletionCounters) queueBefore(p *pipeline) {
	p.queryRow("read deletion counters", `SELECT `+deletedCountersExpr("$1"), []any{d.names}, func(row pgx.Row) error {
		return row.Scan(&d.before)
	})
}

// queueGuardAndBefore queues the batch guard (batchGuardSQL) under epoch
// and, in the same statement, reads the counters.
func (d *deletionCounters) queueGuardAndBefore(p *pipeline, l Layout, uid string, sessions []string, tenant *string, epoch string) {
	p.queryRow("guard the batch", batchGuardSQL(l, `, `+deletedCountersExpr("$6")),
		[]any{uid, sessions, tenant, epoch, l.ContentDigest(), d.names}, func(row pgx.Row) error {
			var ok bool
			return row.Scan(&ok, &d.before)
		})
}

// markErasedSQL marks the sessions $2 erased by the request $1 and reads
// the deletion counters of the tables $3 after the deletes; checkEpoch: it
// raises LE004 unless the catalog epoch is still $4 (epochStillSQL; not
// named otherwise, as the long way runs where migration 00013, which makes
// lethe.require_batch, is not applied). It runs last in the batch, after
// the deletes: erased_at is the wall clock then, just before the commit,
// not the transaction's start — a Backup that started while a long batch
// ran reads the sessions, and must count as holding them. It is
// provisional until dated after the commit (dateBatch, or the last step of
// a later pass if the manager dies first).
func markErasedSQL(checkEpoch bool) string {
	check := `true`
	if checkEpoch {
		check = `lethe.require_batch(` + catalogEpochExpr + ` = $4, true)`
	}
	return `WITH u AS (UPDATE lethe.erasure_ledger SET erased_at = clock_timestamp(), erased_at_provisional = true
			WHERE request_uid = $1 AND scope = 'session' AND record_id = ANY($2::text[]) RETURNING erased_at)
		SELECT coalesce(max(erased_at), clock_timestamp()), ` + deletedCountersExpr("$3") + `, ` + check + `
		FROM u`
}

// queueMarkErasedAndAfter marks the sessions erased (markErasedSQL),
// reads the counters again and sets res.Rows to the difference; epoch, when
// not "", is checked in the same statement.
func (d *deletionCounters) queueMarkErasedAndAfter(p *pipeline, uid string, sessions []string, epoch string, res *erasure.BatchResult) {
	args := []any{uid, sessions, d.names}
	if epoch != "" {
		args = append(args, epoch)
	}
	p.queryRow("mark sessions erased", markErasedSQL(epoch != ""), args, func(row pgx.Row) error {
		var after []int64
		var ok bool
		if err := row.Scan(&res.DeletedAt, &after, &ok); err != nil {
			return err
		}
		for i, t := range d.tables {
			res.Rows = append(res.Rows, erasure.Count{Table: t.String(), Rows: after[i] - d.before[i]})
		}
		return nil
	})
}

// deleteSessionsSQL deletes the sessions $1: the cascade removes the children.
func deleteSessionsSQL(l Layout) string {
	return `DELETE FROM ` + l.Sessions.Ident() + ` WHERE id = ANY($1::uuid[])`
}

func queueSessionDeletes(p *pipeline, l Layout, eligible []string) {
	p.exec("delete sessions", deleteSessionsSQL(l), []any{eligible}, func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != int64(len(eligible)) {
			return fmt.Errorf("deleted %d sessions, expected %d: rolled back", tag.RowsAffected(), len(eligible))
		}
		return nil
	})
}

// pipeline is a pgx batch whose statements each have a reader and a name:
// the reader runs when the statement's result arrives, and an error names
// the statement it came from.
type pipeline struct {
	batch pgx.Batch
	names []string
	// read counts the statements whose reader succeeded: the first failure
	// is at names[read].
	read int
}

func (p *pipeline) queue(name, sql string, args []any) *pgx.QueuedQuery {
	p.names = append(p.names, name)
	return p.batch.Queue(sql, args...)
}

// done counts a statement read when its reader succeeded.
func (p *pipeline) done(err error) error {
	if err == nil {
		p.read++
	}
	return err
}

func (p *pipeline) exec(name, sql string, args []any, read func(pgconn.CommandTag) error) {
	p.queue(name, sql, args).Exec(func(tag pgconn.CommandTag) error { return p.done(read(tag)) })
}

func (p *pipeline) query(name, sql string, args []any, read func(pgx.Rows) error) {
	p.queue(name, sql, args).Query(func(rows pgx.Rows) error { return p.done(read(rows)) })
}

func (p *pipeline) queryRow(name, sql string, args []any, read func(pgx.Row) error) {
	p.queue(name, sql, args).QueryRow(func(row pgx.Row) error { return p.done(read(row)) })
}

// send sends the batch in tx and runs every reader, in order; it stops at
// the first error.
func (p *pipeline) send(ctx context.Context, tx pgx.Tx) error {
	err := tx.SendBatch(ctx, &p.batch).Close()
	if err != nil && p.read < len(p.names) {
		return fmt.Errorf("%s: %w", p.names[p.read], err)
	}
	return err
}
