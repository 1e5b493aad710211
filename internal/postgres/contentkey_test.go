package postgres_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/migrations"
)

// plainContentHashes are the application's hashes of a session's content,
// read from every registered content source.
func plainContentHashes(t *testing.T, conn *pgx.Conn, id string) []string {
	t.Helper()
	hs := queryStrings(t, conn, `SELECT h FROM (
		SELECT summary_sha256 FROM memory.sessions WHERE id = '`+id+`'
		UNION SELECT content_sha256 FROM memory.rounds WHERE session_id = '`+id+`'
		UNION SELECT content_sha256 FROM memory.facts WHERE session_id = '`+id+`'
		UNION SELECT content_sha256 FROM memory.file_snapshots WHERE session_id = '`+id+`') x(h)
		WHERE h IS NOT NULL ORDER BY h`)
	if len(hs) == 0 {
		t.Fatalf("session %s has no content hashes: the test sees nothing", id)
	}
	return hs
}

// contentLedger returns the request's content ledger rows.
func contentLedger(t *testing.T, conn *pgx.Conn, uid string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT record_id FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'content' ORDER BY 1`, uid)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// keyed returns lethe.content_hash of each plain hash, sorted.
func keyed(t *testing.T, conn *pgx.Conn, plain []string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT lethe.content_hash(h) FROM unnest($1::text[]) h ORDER BY 1`, plain)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// appSees reports whether the application role, with memory.tenant_id set
// to reader ("" leaves it unset), reads the cache entry keyed sha.
func appSees(t *testing.T, conn *pgx.Conn, reader, sha string) bool {
	t.Helper()
	ctx := context.Background()
	var n int
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE memory_app`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('memory.tenant_id', $1, true)`, reader); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM memory_derived.embedding_cache WHERE content_sha256 = $1`, sha).Scan(&n)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// appCaches writes a cache entry of sha for the tenant as the application
// does: a new entry, or its tenant added to an existing one.
func appCaches(conn *pgx.Conn, tenant, sha string) error {
	ctx := context.Background()
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE memory_app`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('memory.tenant_id', $1, true)`, tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids)
			VALUES ($1, 'same words', array_fill(0.2, ARRAY[384])::vector, ARRAY[$2])
			ON CONFLICT (content_sha256) DO UPDATE SET tenant_ids = embedding_cache.tenant_ids || $2
			WHERE NOT $2 = ANY(embedding_cache.tenant_ids)`, sha, tenant)
		return err
	})
}

// After the tombstone the ledger holds the keyed hashes of the erased
// content and none of the application's plain hashes; the application
// cannot read the erased cache entries, whoever it says it is.
func TestContentLedgerHoldsKeyedHashesOnly(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	plain := plainContentHashes(t, conn, sessA)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-keyed", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	got := contentLedger(t, conn, req.UID)
	if want := keyed(t, conn, plain); !slices.Equal(got, want) {
		t.Fatalf("content ledger rows %v, want the keyed hashes %v", got, want)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE record_id = ANY($1)`, plain); n != 0 {
		t.Fatalf("%d ledger rows hold a plain content hash: a dictionary of erased content", n)
	}
	// seedTenants caches A's summary, first round and fact with no tenant
	// recorded: hidden from every reader.
	for _, reader := range []string{"", "t1", "t2"} {
		if appSees(t, conn, reader, "sha-a-round-0") {
			t.Errorf("reader %q reads the erased cache entry", reader)
		}
	}
	if !appSees(t, conn, "", "sha-b-round-0") {
		t.Error("the application no longer reads B's live cache entry")
	}
	// The checks for adopters' policies hash before they look.
	var anyTenant, forT1, forT2, old bool
	if err := conn.QueryRow(ctx, `SELECT lethe.is_erased_content($1), lethe.is_erased_content($1, 't1'),
		lethe.is_erased_content($1, 't2'), lethe.is_erased('content', $1)`, "sha-a-round-0").Scan(&anyTenant, &forT1, &forT2, &old); err != nil {
		t.Fatal(err)
	}
	if !anyTenant || !forT1 || forT2 || !old {
		t.Errorf("is_erased_content: any %v, t1 %v, t2 %v; is_erased('content') %v; want true, true, false, true", anyTenant, forT1, forT2, old)
	}

	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}
	// A restore from before the tombstone brings the session back without its
	// ledger rows: the re-erasure writes the keyed hashes of its content again.
	mustExec(t, conn, `DELETE FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'content'`, req.UID)
	resurrect(t, conn, sessA)
	mustExec(t, conn, `UPDATE memory.rounds SET content_sha256 = 'restored-sha' WHERE session_id = $1`, sessA)
	if _, err := e.Reerase(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got, want := contentLedger(t, conn, req.UID), keyed(t, conn, []string{"restored-sha"}); !slices.Equal(got, want) {
		t.Errorf("after the re-erasure the content rows are %v, want %v", got, want)
	}
}

const (
	sessT1 = "00000000-0000-4000-8000-0000000000d1" // tenant t1, erased
	sessT2 = "00000000-0000-4000-8000-0000000000d2" // tenant t2: said the same words
)

// seedSharedText writes a session of t1 and one of t2 that said the same
// words ("shared"), cached once for both; t1's own words ("t1-only"), and
// an entry of t1's content that records no tenant ("untagged"). A's
// summary embedding is the shared entry's, so the residue probe meets it.
// Before version 9 (v8) the cache records no tenants.
func seedSharedText(t *testing.T, conn *pgx.Conn, v8 bool) {
	t.Helper()
	vec := `array_fill(0.3, ARRAY[384])::vector`
	mustExec(t, conn, `INSERT INTO memory.sessions (id, tenant_id, summary_sha256, summary_embedding) VALUES
		($1, 't1', 'shared', `+vec+`), ($2, 't2', 'shared', `+vec+`)`, sessT1, sessT2)
	mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, content_sha256) VALUES ($1, 0, 't1-only'), ($1, 1, 'untagged')`, sessT1)
	if v8 {
		mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding) VALUES
			('shared', 'same words', `+vec+`), ('t1-only', 'own words', array_fill(0.4, ARRAY[384])::vector),
			('untagged', 'more words', array_fill(0.5, ARRAY[384])::vector)`)
		return
	}
	mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids) VALUES
		('shared', 'same words', `+vec+`, ARRAY['t1', 't2']),
		('t1-only', 'own words', array_fill(0.4, ARRAY[384])::vector, ARRAY['t1']),
		('untagged', 'more words', array_fill(0.5, ARRAY[384])::vector, NULL)`)
}

// Tenant t1's erasure of words tenant t2 also said and cached leaves t2's
// use of the entry: t2 reads it throughout, t1 never again, and the entry
// stays with t1 taken off it. Run as lethe_operator, with its grants.
func TestErasureLeavesAnotherTenantsIdenticalText(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	admin := connect(t, dsn)
	seedSharedText(t, admin, false)
	pool, err := postgres.Connect(ctx, asRole(t, admin, dsn, "lethe_test_operator", "lethe_operator"), postgres.Options{Vector: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	req := erasure.Request{UID: "uid-shared", SessionIDs: []string{sessT1}}
	plan, err := e.Tombstone(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if plan.ContentIndexEntries != 3 {
		t.Errorf("plan: %d content-keyed entries, want 3 (t1 off 'shared', 't1-only', 'untagged')", plan.ContentIndexEntries)
	}
	wantSees := func(when string, want map[string]map[string]bool) {
		t.Helper()
		for sha, readers := range want {
			for reader, sees := range readers {
				if got := appSees(t, admin, reader, sha); got != sees {
					t.Errorf("%s: reader %q sees %q: %v, want %v", when, reader, sha, got, sees)
				}
			}
		}
	}
	// In the grace period the shared entry still serves t1's erased use:
	// hidden from t1 and from a reader that does not say who it is.
	wantSees("grace period", map[string]map[string]bool{
		"shared":   {"t2": true, "t1": false, "": false},
		"t1-only":  {"t2": false, "t1": false, "": false},
		"untagged": {"t2": false, "t1": false, "": false},
	})

	res, err := e.Delete(ctx, req, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Batches[0].ContentIndexEntries; got != 3 {
		t.Errorf("deletion: %d content-keyed entries, want 3", got)
	}
	var tenants []string
	if err := admin.QueryRow(ctx, `SELECT tenant_ids FROM memory_derived.embedding_cache WHERE content_sha256 = 'shared'`).Scan(&tenants); err != nil {
		t.Fatalf("t2's entry is gone: %v", err)
	}
	if !slices.Equal(tenants, []string{"t2"}) {
		t.Errorf("shared entry lists %v, want [t2]", tenants)
	}
	if n := count(t, admin, `SELECT count(*) FROM memory_derived.embedding_cache WHERE content_sha256 IN ('t1-only', 'untagged')`); n != 0 {
		t.Errorf("%d entries of t1's own content left", n)
	}
	wantSees("after the deletion", map[string]map[string]bool{
		"shared": {"t2": true, "": true, "t1": false},
	})
	checks, err := verifyBothWays(ctx, e, req, res.ContentKeys)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if c.Found != 0 {
			t.Errorf("verify: %s = %d", c.Check, c.Found)
		}
	}
	// t2's entry holds the erased summary's embedding, and is not residue;
	// the same embedding under a key no erasure names is.
	if residue, err := e.ProbeResidue(ctx, res.Probe, 1e-6); err != nil || len(residue) != 0 {
		t.Errorf("residue %+v (%v): t2's own entry taken for a copy the erasure missed", residue, err)
	}
	mustExec(t, admin, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids)
		SELECT 'copied-under-another-key', text, embedding, tenant_ids FROM memory_derived.embedding_cache WHERE content_sha256 = 'shared'`)
	if residue, err := e.ProbeResidue(ctx, res.Probe, 1e-6); err != nil || len(residue) != 1 || residue[0].Column != "memory_derived.embedding_cache.embedding" {
		t.Errorf("residue %+v (%v), want the copy under another key", residue, err)
	}
	mustExec(t, admin, `DELETE FROM memory_derived.embedding_cache WHERE content_sha256 = 'copied-under-another-key'`)

	// t1 cannot cache the erased words again; t2 can cache t1's words as its own.
	var pgErr *pgconn.PgError
	if err := appCaches(admin, "t1", "shared"); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("t1 re-caching erased words: %v, want a row-level security refusal", err)
	}
	if err := appCaches(admin, "t2", "t1-only"); err != nil {
		t.Errorf("t2 caching the same words as t1's erased ones: %v", err)
	}
	if !appSees(t, admin, "t2", "t1-only") || appSees(t, admin, "t1", "t1-only") {
		t.Error("t2's new entry: want it readable by t2 and not by t1")
	}
}

// A store without a tenant erases for every tenant, as before the tenants:
// the shared entry goes.
func TestErasureWithoutTenantRemovesSharedEntries(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedSharedText(t, conn, false)
	e := eraser(t, dsn, "")
	req := erasure.Request{UID: "uid-all-tenants", SessionIDs: []string{sessT1}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if appSees(t, conn, "t2", "shared") {
		t.Error("an erasure for every tenant left the shared entry readable")
	}
	res, err := e.Delete(ctx, req, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Batches[0].ContentIndexEntries; got != 3 {
		t.Errorf("deleted %d content-keyed entries, want 3", got)
	}
	if n := count(t, conn, `SELECT count(*) FROM memory_derived.embedding_cache`); n != 0 {
		t.Errorf("%d cache entries left, want none", n)
	}
}

// migrator returns a goose provider over dsn's database for the embedded
// migrations, to move it to a given version.
func migrator(t *testing.T, dsn string) *goose.Provider {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(postgres.MigrationTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// databaseAt creates a new database migrated to version and returns its DSN
// and the provider that moves it on.
func databaseAt(t *testing.T, version int64) (string, *goose.Provider) {
	t.Helper()
	name, err := pg.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dsn := pg.DSN(name)
	p := migrator(t, dsn)
	migrateTo(t, p, version)
	return dsn, p
}

// migrateTo moves the database up or down to version.
func migrateTo(t *testing.T, p *goose.Provider, version int64) {
	t.Helper()
	ctx := context.Background()
	current, err := p.GetDBVersion(ctx)
	if err != nil {
		current = 0 // a new database: no version table yet
	}
	if version >= current {
		_, err = p.UpTo(ctx, version)
	} else {
		_, err = p.DownTo(ctx, version)
	}
	if err != nil {
		t.Fatalf("migrate from %d to %d: %v", current, version, err)
	}
}

// A database erased under version 8 holds plain content hashes: version 9
// keys them, and the block holds through the upgrade, a downgrade and the
// upgrade again.
func TestMigrationKeysExistingContentRows(t *testing.T) {
	ctx := context.Background()
	dsn, p := databaseAt(t, 8)
	conn := connect(t, dsn)
	seedSharedText(t, conn, true)
	// What version 8 wrote for t1's tombstone: plain hashes. An older request
	// of a store without a tenant erased other words for everyone.
	mustExec(t, conn, `UPDATE memory.sessions SET tombstoned_at = now(), tombstoned_by = 'v8-req' WHERE id = $1`, sessT1)
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id) VALUES
		('session', $1, 'v8-req', 't1'), ('content', 'shared', 'v8-req', 't1'), ('content', 't1-only', 'v8-req', 't1'),
		('content', 'untagged', 'v8-req', 't1'), ('content', 'everyones', 'v8-old', NULL)`, sessT1)
	mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding) VALUES
		('everyones', 'old words', array_fill(0.6, ARRAY[384])::vector)`)
	plain := []string{"everyones", "shared", "t1-only", "untagged"}

	migrateTo(t, p, 9)
	got := queryStrings(t, conn, `SELECT record_id FROM lethe.erasure_ledger WHERE scope = 'content' ORDER BY 1`)
	if want := keyed(t, conn, plain); !slices.Equal(got, want) {
		t.Fatalf("after the upgrade the content rows are %v, want the keyed hashes %v", got, want)
	}
	var tenants []string
	if err := conn.QueryRow(ctx, `SELECT tenant_ids FROM memory_derived.embedding_cache WHERE content_sha256 = 'shared'`).Scan(&tenants); err != nil ||
		!slices.Equal(tenants, []string{"t1", "t2"}) {
		t.Errorf("shared entry's tenants after the upgrade: %v (%v), want [t1 t2] from the sessions using it", tenants, err)
	}
	blocked := func(when string) {
		t.Helper()
		for _, sha := range []string{"everyones", "t1-only"} {
			for _, reader := range []string{"", "t1", "t2"} {
				if appSees(t, conn, reader, sha) {
					t.Errorf("%s: reader %q reads the erased entry %q", when, reader, sha)
				}
			}
		}
		if appSees(t, conn, "t1", "shared") {
			t.Errorf("%s: t1 reads its erased words", when)
		}
	}
	blocked("after the upgrade")
	if !appSees(t, conn, "t2", "shared") {
		t.Error("after the upgrade t2 no longer reads its own words")
	}

	migrateTo(t, p, 8)
	if n := count(t, conn, `SELECT count(*) FROM information_schema.columns
		WHERE (table_name, column_name) IN (('embedding_cache', 'tenant_ids'), ('content_indexes', 'tenant_column'))`); n != 0 {
		t.Errorf("the downgrade left %d of the new columns", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM lethe.erasure_ledger WHERE record_id = ANY($1)`, plain); n != 0 {
		t.Error("the downgrade wrote plain content hashes back")
	}
	// Version 8's policy: every erased entry hidden from everyone.
	for _, sha := range plain {
		if appSees(t, conn, "t2", sha) {
			t.Errorf("after the downgrade the erased entry %q is readable", sha)
		}
	}
	// Version 8's Lethe writes plain hashes again; they block as before.
	mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding) VALUES
		('later', 'later words', array_fill(0.7, ARRAY[384])::vector)`)
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid) VALUES ('content', 'later', 'v8-later')`)
	if appSees(t, conn, "", "later") {
		t.Error("after the downgrade a plain content row does not block")
	}

	migrateTo(t, p, 9)
	plain = append(plain, "later")
	slices.Sort(plain)
	got = queryStrings(t, conn, `SELECT record_id FROM lethe.erasure_ledger WHERE scope = 'content' ORDER BY 1`)
	if want := keyed(t, conn, plain); !slices.Equal(got, want) {
		t.Fatalf("after the second upgrade the content rows are %v, want the keyed hashes %v (each hashed once)", got, want)
	}
	blocked("after the second upgrade")
	if appSees(t, conn, "t2", "later") {
		t.Error("after the second upgrade the entry erased under version 8 is readable")
	}
}
