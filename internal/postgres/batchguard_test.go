package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// A batch not wholly eligible — one of its sessions erased first by
// another request, one cancelled — is declined by the short way's guard
// and erased the long way: the gone session is recorded erased for this
// request too, the cancelled one stays, the rest go, with one receipt.
func TestTheShortWayDeclinesABatchNotWhollyEligible(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	e := primedPasses(t, dsn, conn)()
	ids := seedTiny(t, conn, "dddddddd", 4)
	req := erasure.Request{UID: "uid-partial", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	other := erasure.Request{UID: "uid-first", SessionIDs: ids[:1]}
	if _, err := e.Tombstone(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, other, 10, 0); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `UPDATE lethe.erasure_ledger SET cancelled_at = now() WHERE request_uid = $1 AND record_id = $2`, req.UID, ids[1])

	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w.Declined != 1 || w.Short != 1 {
		t.Errorf("batches by way: %+v, want the other request's short and this one declined", w)
	}
	if len(res.Batches) != 1 || res.Batches[0].Sessions != 2 {
		t.Fatalf("delete result: %+v, want one batch of the 2 eligible sessions", res.Batches)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, ids); n != 1 {
		t.Errorf("%d sessions left, want 1 (the cancelled one)", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND erased_at IS NOT NULL`, req.UID); n != 3 {
		t.Errorf("%d of the request's ledger rows erased, want 3 (the one gone before, the 2 deleted)", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_receipts WHERE request_uid = $1 AND step = 'Deleted'`, req.UID); n != 1 {
		t.Errorf("%d Deleted receipts, want 1", n)
	}
}

// A database without lethe.require_batch (migration 00013 not applied)
// erases every batch the long way.
func TestWithoutTheBatchGuardEveryBatchTakesTheLongWay(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	mustExec(t, conn, `DROP FUNCTION lethe.require_batch(boolean, boolean)`)
	e := eraser(t, dsn, "t1")
	ids := seedTiny(t, conn, "eeeeeeee", 5)
	req := erasure.Request{UID: "uid-old-db", SessionIDs: ids}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w != (postgres.BatchWays{Long: 3}) {
		t.Errorf("batches by way: %+v, want all 3 the long way", w)
	}
	if len(res.Batches) != 3 {
		t.Fatalf("delete result: %+v", res.Batches)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = ANY($1::uuid[])`, ids); n != 0 {
		t.Errorf("%d sessions left", n)
	}
}

// The event trigger that replaces the catalog epoch cannot be switched off
// around a schema change unseen: disabling it ends the short way, and
// enabling it again gives the epoch a new identity, so the next batch
// audits the schema the long way and refuses the change made meanwhile.
func TestTheShortWayNoticesItsEventTriggerSwitchedOffAndOn(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	pass := primedPasses(t, dsn, conn)
	ids := seedTiny(t, conn, "ffffffff", 2)
	for i, id := range ids {
		if _, err := pass().Tombstone(ctx, erasure.Request{UID: fmt.Sprintf("uid-evt-%d", i), SessionIDs: []string{id}}); err != nil {
			t.Fatal(err)
		}
	}

	mustExec(t, conn, `ALTER EVENT TRIGGER lethe_catalog_changed DISABLE`)
	e := pass()
	if _, err := e.Delete(ctx, erasure.Request{UID: "uid-evt-0", SessionIDs: ids[:1]}, 10, 0); err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w != (postgres.BatchWays{Long: 1}) {
		t.Errorf("batches by way with the event trigger disabled: %+v, want the long way", w)
	}
	mustExec(t, conn, `CREATE TABLE memory.session_tags (session_id uuid, tag text)`)
	mustExec(t, conn, `ALTER EVENT TRIGGER lethe_catalog_changed ENABLE ALWAYS`)

	e = pass()
	_, err := e.Delete(ctx, erasure.Request{UID: "uid-evt-1", SessionIDs: ids[1:]}, 10, 0)
	var ce *erasure.ConfigError
	if !errors.As(err, &ce) || ce.Reason != lethev1.ReasonSchemaChanged || !strings.Contains(ce.Message, "memory.session_tags") {
		t.Fatalf("deletion after a change made with the event trigger off: %v, want %s naming memory.session_tags", err, lethev1.ReasonSchemaChanged)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, ids[1]); n != 1 {
		t.Errorf("the session was deleted (%d left)", n)
	}
}

// An application's temporary tables leave the epoch alone (they cannot
// break the erasure rules); any other DDL replaces it.
func TestTheCatalogEpochChangesWithDDLButNotTemporaryTables(t *testing.T) {
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	epoch := func() string {
		var s string
		if err := conn.QueryRow(context.Background(), `SELECT token::text FROM lethe.catalog_epoch`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	start := epoch()
	mustExec(t, conn, `CREATE TEMP TABLE scratch (id int); CREATE INDEX ON scratch (id); ALTER TABLE scratch ADD COLUMN x int`)
	if got := epoch(); got != start {
		t.Error("a temporary table replaced the catalog epoch")
	}
	for _, ddl := range []string{
		`CREATE TABLE public.other (id int)`,
		`DROP TABLE public.other`,
		`ALTER TABLE memory.rounds NO FORCE ROW LEVEL SECURITY`,
		`COMMENT ON TABLE memory.rounds IS 'x'`,
		`UPDATE lethe.lineage_tables SET source_column = source_column`,
		`UPDATE lethe.content_sources SET hash_column = hash_column`,
		`DELETE FROM lethe.source_columns`,
	} {
		before := epoch()
		mustExec(t, conn, ddl)
		if epoch() == before {
			t.Errorf("%q left the catalog epoch unchanged", ddl)
		}
	}
}

// Ways around the catalog epoch (an adversarial review found each): a
// first change (prep, on a connection of its own) that would let a later
// one go unseen, a batch the long way, then the breaking change. The
// deletion after it must refuse the way the audit does, naming the table.
func TestTheShortWayCannotBeTurnedBlind(t *testing.T) {
	for name, tc := range map[string]struct{ prep, change, table string }{
		"registry trigger disabled, then the registry emptied": {
			`ALTER TABLE lethe.lineage_tables DISABLE TRIGGER lineage_tables_changed`,
			`DELETE FROM lethe.lineage_tables`, "lethe.lineage_tables"},
		"registry written in replica mode": {
			`SELECT 1`,
			`SET session_replication_role = replica; DELETE FROM lethe.lineage_tables; SET session_replication_role = origin`, "lethe.lineage_tables"},
		"an unguarded lineage table registered through a child of the registry": {
			`CREATE TABLE lethe.lineage_more () INHERITS (lethe.lineage_tables)`,
			`INSERT INTO lethe.lineage_more VALUES ('memory.facts', 'session_id', 'id', 'memory.artifacts', 'id')`, "memory.facts"},
		"the lineage guard made to depend on a temporary function, then DISCARD TEMP": {
			`CREATE FUNCTION pg_temp.yes() RETURNS boolean LANGUAGE sql AS 'SELECT true';
			 DROP TRIGGER derivations_refuse_erased_lineage ON memory_derived.derivations;
			 CREATE TRIGGER derivations_refuse_erased_lineage BEFORE INSERT OR UPDATE ON memory_derived.derivations
				FOR EACH ROW WHEN (pg_temp.yes()) EXECUTE FUNCTION lethe.refuse_erased_lineage('source_session_id')`,
			`DISCARD TEMP`, "memory_derived.derivations"},
		"the token's function replaced by one that does nothing": {
			`CREATE OR REPLACE FUNCTION lethe.bump_catalog_epoch() RETURNS void
				LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, lethe
				AS $$ UPDATE lethe.catalog_epoch SET token = token WHERE false $$`,
			`CREATE TABLE memory.session_tags (session_id uuid, tag text)`, "memory.session_tags"},
		"a rule keeping the token": {
			`CREATE RULE keep AS ON UPDATE TO lethe.catalog_epoch DO INSTEAD NOTHING`,
			`CREATE TABLE memory.session_tags (session_id uuid, tag text)`, "memory.session_tags"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := migratedDB(t)
			conn := connect(t, dsn)
			seedTenants(t, conn)
			pass := primedPasses(t, dsn, conn)
			req := erasure.Request{UID: "uid-blind", SessionIDs: []string{sessA}}
			if _, err := pass().Tombstone(ctx, req); err != nil {
				t.Fatal(err)
			}
			other := connect(t, dsn)
			mustExec(t, other, tc.prep)
			// A batch after the first change: the long way, which must not
			// trust the epoch from then on.
			id := seedTiny(t, conn, "abababab", 1)
			between := erasure.Request{UID: "uid-between", SessionIDs: id}
			e := pass()
			if _, err := e.Tombstone(ctx, between); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Delete(ctx, between, 10, 0); err != nil {
				t.Fatal(err)
			}
			mustExec(t, other, tc.change)

			e = pass()
			_, err := e.Delete(ctx, req, 10, 0)
			var ce *erasure.ConfigError
			if !errors.As(err, &ce) || ce.Reason != lethev1.ReasonSchemaChanged || !strings.Contains(ce.Message, tc.table) {
				t.Fatalf("deletion after the change: %v (batches %+v), want %s naming %s", err, e.Ways(), lethev1.ReasonSchemaChanged, tc.table)
			}
			if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 1 {
				t.Errorf("the session was deleted (%d left)", n)
			}
		})
	}
}

// A copy of a session in a table inheriting from sessions gives the guard
// two rows for one session: the batch [A, B], B gone and still in its
// grace period, must not pass for wholly eligible, nor B be marked erased
// or its derived records deleted.
func TestTheShortWayCountsSessionsNotRows(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	pass := primedPasses(t, dsn, conn)
	req := erasure.Request{UID: "uid-rows", SessionIDs: []string{sessA, sessB}}
	if _, err := pass().Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `UPDATE lethe.erasure_ledger SET grace_ends_at = now() + interval '1 hour' WHERE request_uid = $1 AND record_id = $2`, req.UID, sessB)
	mustExec(t, conn, `CREATE TABLE public.sessions_copy () INHERITS (memory.sessions)`)
	mustExec(t, conn, `INSERT INTO public.sessions_copy SELECT * FROM ONLY memory.sessions WHERE id = $1`, sessA)
	// B's own derivations (the profile of A and B goes with A).
	const ownOfB = `SELECT count(*) FROM memory_derived.derivations d WHERE source_session_id = $1
		AND NOT EXISTS (SELECT 1 FROM memory_derived.derivations x WHERE x.derived_id = d.derived_id AND x.source_session_id = $2)`
	derivedOfB := count(t, conn, ownOfB, sessB, sessA)
	// The CREATE TABLE changed the epoch: a batch of another request lets
	// the long way audit it (and, if compliant, remember it).
	between := erasure.Request{UID: "uid-between", SessionIDs: seedTiny(t, conn, "acacacac", 1)}
	if _, err := pass().Tombstone(ctx, between); err != nil {
		t.Fatal(err)
	}
	if _, err := pass().Delete(ctx, between, 10, 0); err != nil {
		t.Fatal(err)
	}

	e := pass()
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w.Declined != 1 {
		t.Errorf("batches by way: %+v, want the batch declined by the short way", w)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND record_id = $2 AND erased_at IS NOT NULL`, req.UID, sessB); n != 0 {
		t.Error("B, in its grace period, was marked erased")
	}
	if n := count(t, conn, ownOfB, sessB, sessA); n != derivedOfB || n == 0 {
		t.Errorf("B's derivations: %d, want %d (B is in its grace period)", n, derivedOfB)
	}
}

// A content source registered after a compliant audit is in the layout the
// next erasure acts on: its hashes are in the ledger (registering one is
// not DDL; with no trigger on lethe.content_sources the memoized layout
// went on without it, and the ledger missed the new source's hashes).
func TestAContentSourceRegisteredAfterTheAuditIsInTheNextLedger(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	addArtifactHashes(t, conn)
	pass := primedPasses(t, dsn, conn)
	mustExec(t, conn, `INSERT INTO lethe.content_sources (source_table, hash_column) VALUES ('memory.artifacts', 'content_sha256')`)

	req := erasure.Request{UID: "uid-new-source", SessionIDs: []string{sessA}}
	if _, err := pass().Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n := artifactLedgerRows(t, conn, req.UID, sessA); n != 1 {
		t.Errorf("%d ledger rows for the newly registered source's hash, want 1", n)
	}
}

// A content source registered while a request waits out its grace period
// is in that request's ledger once its sessions are deleted, also when
// another deletion has audited the new layout since and the short way is
// open: the tombstone wrote the content rows under the old layout, so the
// short way declines the batch and the long way writes them again.
func TestAContentSourceRegisteredDuringTheGracePeriodIsInTheLedger(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	addArtifactHashes(t, conn)
	pass := primedPasses(t, dsn, conn)

	req := erasure.Request{UID: "uid-in-grace", SessionIDs: []string{sessA}}
	if _, err := pass().Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `INSERT INTO lethe.content_sources (source_table, hash_column) VALUES ('memory.artifacts', 'content_sha256')`)
	other := erasure.Request{UID: "uid-other", SessionIDs: seedTiny(t, conn, "dddddddd", 1)}
	o := pass()
	if _, err := o.Tombstone(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Delete(ctx, other, 10, 0); err != nil {
		t.Fatal(err)
	}
	if w := o.Ways(); w.Long != 1 {
		t.Fatalf("the other deletion's batches: %+v, want one long way (it audits the new layout)", w)
	}

	e := pass()
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w.Declined != 1 || w.Short != 0 {
		t.Errorf("batches by way: %+v, want the batch declined by the short way", w)
	}
	if n := artifactLedgerRows(t, conn, req.UID, sessA); n != 1 {
		t.Errorf("%d ledger rows for the hash of the source registered during the grace period, want 1", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 0 {
		t.Error("the session was not deleted")
	}
}

// Without migration 00018's column the deletion still runs, the long way,
// and writes every batch's content rows under its own audited layout.
func TestWithoutTheLedgersLayoutDigestEveryBatchWritesItsContentRows(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	addArtifactHashes(t, conn)
	pass := primedPasses(t, dsn, conn)
	mustExec(t, conn, `ALTER TABLE lethe.erasure_ledger DROP COLUMN layout_digest`)

	req := erasure.Request{UID: "uid-no-epoch", SessionIDs: []string{sessA}}
	if _, err := pass().Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `INSERT INTO lethe.content_sources (source_table, hash_column) VALUES ('memory.artifacts', 'content_sha256')`)
	e := pass()
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w.Short != 0 || w.Long != 1 {
		t.Errorf("batches by way: %+v, want the long way", w)
	}
	if n := artifactLedgerRows(t, conn, req.UID, sessA); n != 1 {
		t.Errorf("%d ledger rows for the hash of the source registered during the grace period, want 1", n)
	}
}

// With no catalog epoch (the event trigger disabled, or never created by a
// migration run without superuser) the long way still writes again the
// content rows of a session tombstoned from another layout.
func TestWithoutAnEpochASourceRegisteredDuringTheGracePeriodIsInTheLedger(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	mustExec(t, conn, `ALTER EVENT TRIGGER lethe_catalog_changed DISABLE`)
	addArtifactHashes(t, conn)

	req := erasure.Request{UID: "uid-no-trigger", SessionIDs: []string{sessA}}
	if _, err := eraser(t, dsn, "t1").Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `INSERT INTO lethe.content_sources (source_table, hash_column) VALUES ('memory.artifacts', 'content_sha256')`)
	e := eraser(t, dsn, "t1")
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if w := e.Ways(); w.Short != 0 || w.Long != 1 {
		t.Errorf("batches by way: %+v, want the long way (no epoch)", w)
	}
	if n := artifactLedgerRows(t, conn, req.UID, sessA); n != 1 {
		t.Errorf("%d ledger rows for the hash of the source registered during the grace period, want 1", n)
	}
}

// A content source registered after the long way's audit, while its batch
// waits for a session's lock, rolls the batch back (the epoch it audited
// under is checked again at its end), and the batch's next audit writes
// the new source's rows before it deletes.
func TestTheLongWayChecksItsAuditedEpochAtItsEnd(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	addArtifactHashes(t, conn)

	req := erasure.Request{UID: "uid-late-source", SessionIDs: []string{sessA}}
	if _, err := eraser(t, dsn, "t1").Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	e := eraser(t, dsn, "t1")
	deleteWhileASourceIsRegistered(t, dsn, conn, e, req, "%FOR UPDATE%")
	if w := e.Ways(); w.Short != 0 || w.Long != 1 {
		t.Errorf("batches by way: %+v, want one long way", w)
	}
	if n := artifactLedgerRows(t, conn, req.UID, sessA); n != 1 {
		t.Errorf("%d ledger rows for the hash of the source registered during the batch, want 1", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 0 {
		t.Error("the session was not deleted")
	}
}

// Migration 00018 applied during a request's grace period: the session rows
// written before it record no layout, and the deletion writes their content
// rows again from its own.
func TestSessionsTombstonedBeforeTheLayoutDigestHaveTheirContentRowsWrittenAgain(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	addArtifactHashes(t, conn)
	pass := primedPasses(t, dsn, conn)
	mustExec(t, conn, `ALTER TABLE lethe.erasure_ledger DROP COLUMN layout_digest`)

	req := erasure.Request{UID: "uid-before-00018", SessionIDs: []string{sessA}}
	if _, err := pass().Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `INSERT INTO lethe.content_sources (source_table, hash_column) VALUES ('memory.artifacts', 'content_sha256')`)
	mustExec(t, conn, `ALTER TABLE lethe.erasure_ledger ADD COLUMN layout_digest text`)
	e := pass()
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	if n := artifactLedgerRows(t, conn, req.UID, sessA); n != 1 {
		t.Errorf("%d ledger rows for the hash of the source registered during the grace period, want 1", n)
	}
}

// A partition holding a session's content attached to a registered content
// source during the grace period: a read of the source now reaches its
// rows, so the layout's digest changes and the deletion writes the
// partition's hashes to the ledger (the source's name alone is unchanged).
func TestAPartitionAttachedDuringTheGracePeriodIsInTheLedger(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	for _, stmt := range []string{
		`CREATE TABLE memory.notes (session_id uuid NOT NULL REFERENCES memory.sessions (id) ON DELETE CASCADE,
			kind text NOT NULL, content_sha256 text) PARTITION BY LIST (kind)`,
		`CREATE TABLE memory.notes_current PARTITION OF memory.notes FOR VALUES IN ('current')`,
		`CREATE TABLE memory.notes_archive (session_id uuid NOT NULL REFERENCES memory.sessions (id) ON DELETE CASCADE,
			kind text NOT NULL, content_sha256 text)`,
	} {
		mustExec(t, conn, stmt)
	}
	for _, table := range []string{"memory.notes", "memory.notes_current", "memory.notes_archive"} {
		mustExec(t, conn, `ALTER TABLE `+table+` ENABLE ROW LEVEL SECURITY`)
		mustExec(t, conn, `ALTER TABLE `+table+` FORCE ROW LEVEL SECURITY`)
		mustExec(t, conn, `CREATE POLICY everyone ON `+table+` USING (true)`)
	}
	mustExec(t, conn, `INSERT INTO memory.notes VALUES ($1, 'current', 'sha-note-current')`, sessA)
	mustExec(t, conn, `INSERT INTO memory.notes_archive VALUES ($1, 'archive', 'sha-note-archive')`, sessA)
	mustExec(t, conn, `INSERT INTO lethe.content_sources (source_table, hash_column) VALUES ('memory.notes', 'content_sha256')`)
	pass := primedPasses(t, dsn, conn)

	req := erasure.Request{UID: "uid-attached", SessionIDs: []string{sessA}}
	if _, err := pass().Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `ALTER TABLE memory.notes ATTACH PARTITION memory.notes_archive FOR VALUES IN ('archive')`)
	e := pass()
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"sha-note-current", "sha-note-archive"} {
		if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'content'
			AND record_id = lethe.content_hash($2)`, req.UID, h); n != 1 {
			t.Errorf("%d ledger rows for %s, want 1", n, h)
		}
	}
}

// A steady stream of DDL elsewhere in the database (every command replaces
// the epoch) does not starve a deletion: its audits see the catalog move,
// and the last attempt goes on as where there is no event trigger.
func TestSteadyDDLDoesNotStarveTheLongWay(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	req := erasure.Request{UID: "uid-churn", SessionIDs: []string{sessA}}
	if _, err := eraser(t, dsn, "t1").Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	churn := connect(t, dsn)
	stop := make(chan struct{})
	churned := make(chan int)
	go func() {
		n := 0
		defer func() { churned <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := churn.Exec(ctx, `CREATE TABLE public.churn (x int); DROP TABLE public.churn`); err != nil {
				return
			}
			n++
		}
	}()
	e := eraser(t, dsn, "t1")
	_, err := e.Delete(ctx, req, 10, 0)
	close(stop)
	if n := <-churned; n < 10 {
		t.Fatalf("only %d DDL rounds ran during the deletion: the stream did not churn", n)
	}
	if err != nil {
		t.Fatalf("deletion under steady DDL: %v", err)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 0 {
		t.Error("the session was not deleted")
	}
}

// addArtifactHashes gives memory.artifacts a content-hash column, each
// row's value "sha-artifact-" and its session, not yet registered.
func addArtifactHashes(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	mustExec(t, conn, `ALTER TABLE memory.artifacts ADD COLUMN content_sha256 text`)
	mustExec(t, conn, `UPDATE memory.artifacts SET content_sha256 = 'sha-artifact-' || session_id`)
}

// artifactLedgerRows counts the request uid's content ledger rows of the
// artifact hash of session (addArtifactHashes).
func artifactLedgerRows(t *testing.T, conn *pgx.Conn, uid, session string) int64 {
	t.Helper()
	return count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'content'
		AND record_id = lethe.content_hash('sha-artifact-' || $2)`, uid, session)
}

// The short way checks the epoch again in its last statement: a content
// source registered while its guard waited for a session's lock (the
// guard read the catalog under a snapshot taken before the wait) sends the
// batch the long way, which writes the new source's content rows.
func TestTheShortWayChecksItsEpochAtItsEnd(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	addArtifactHashes(t, conn)
	e := primedPasses(t, dsn, conn)()

	req := erasure.Request{UID: "uid-late-source-short", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	deleteWhileASourceIsRegistered(t, dsn, conn, e, req, "%lethe.require_batch%")
	if w := e.Ways(); w != (postgres.BatchWays{Declined: 1, Long: 1}) {
		t.Errorf("batches by way: %+v, want the short way declined, then the long way", w)
	}
	if n := artifactLedgerRows(t, conn, req.UID, sessA); n != 1 {
		t.Errorf("%d ledger rows for the hash of the source registered during the batch, want 1", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 0 {
		t.Error("the session was not deleted")
	}
}

// deleteWhileASourceIsRegistered deletes req's one session (sessA) with e
// while another transaction holds the session's lock: once a statement
// like waiting waits for it, memory.artifacts is registered as a content
// source and the lock is released; it returns when the deletion is done.
func deleteWhileASourceIsRegistered(t *testing.T, dsn string, conn *pgx.Conn, e *postgres.Eraser, req erasure.Request, waiting string) {
	t.Helper()
	ctx := context.Background()
	tx, err := connect(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM memory.sessions WHERE id = $1 FOR UPDATE`, sessA); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.Delete(ctx, req, 10, 0)
		done <- err
	}()
	waitForLock(t, conn, waiting)
	mustExec(t, conn, `INSERT INTO lethe.content_sources (source_table, hash_column) VALUES ('memory.artifacts', 'content_sha256')`)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
