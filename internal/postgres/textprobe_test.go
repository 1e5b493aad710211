package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// Texts of the erased session A (each at least 32 words: a passage of four
// 8-word shingles) and of the live session B.
const (
	erasedSummary = "Anna asked how to move her mother's pension account from the old bank in Leeds to the credit union before the winter fees go up again this year"
	erasedUser    = "My name is Anna Kowalski and I live at 14 Elm Street.\nMy mother was diagnosed with early dementia last spring and I now manage her pension account for her"
	erasedReply   = "You can transfer the account once the lasting power of attorney is registered with the Office of the Public Guardian which usually takes eight to ten weeks in practice"
	erasedFact    = "The user manages the pension of a parent with dementia and holds a lasting power of attorney that was registered in March with the Office of the Public Guardian"
	liveUser      = "Please summarise the quarterly report on warehouse throughput and flag any site where the error rate rose above two percent during the last three months of the year"
)

// shingleOf is the i-th (0-based) run of 8 words of s, as s has them.
func shingleOf(s string, i int) string {
	w := strings.Fields(s)[8*i : 8*i+8]
	return strings.Join(w, " ")
}

// edited is s with the word at each index replaced.
func edited(s string, at ...int) string {
	w := strings.Fields(s)
	for _, i := range at {
		w[i] = "changed"
	}
	return strings.Join(w, " ")
}

// seedTextResidue writes session A (to erase) and B (live), copies of A's
// text outside the cascade (verbatim, in another schema, in json, half of
// a passage), near-copies below the threshold, a copy of A's text in B's
// own rounds, and a copy of B's text outside the cascade.
func seedTextResidue(t *testing.T, dsn string) {
	t.Helper()
	conn := connect(t, dsn)
	mustExec(t, conn, `INSERT INTO memory.sessions (id, tenant_id, summary) VALUES ($1, 't1', $2), ($3, 't1', 'short')`, sessA, erasedSummary, sessB)
	mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text, assistant_text) VALUES
		($1, 0, $2, 'ok'), ($1, 1, 'and then?', $3), ($4, 0, $5, 'fine'), ($4, 1, $2, 'the same words, said in B')`,
		sessA, erasedUser, erasedReply, sessB, liveUser)
	mustExec(t, conn, `INSERT INTO memory.facts (session_id, kind, content) VALUES ($1, 'learning', $2)`, sessA, erasedFact)
	for _, stmt := range []string{
		// A nondeterministic collation refuses LIKE and strpos: on a column
		// of the cascade and on one outside, the probe must still run.
		`CREATE COLLATION public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
		`ALTER TABLE memory.facts ALTER COLUMN content TYPE text COLLATE public.ci`,
		`CREATE TABLE public.people (name text COLLATE public.ci)`,
		`CREATE SCHEMA archive`,
		`CREATE SCHEMA scratch`,
		`CREATE TABLE public.notes (id int, body text)`,
		`CREATE TABLE public.half_copies (body text)`,
		`CREATE TABLE public.near_copies (body text)`,
		`CREATE TABLE archive.exports (payload varchar(500), doc jsonb)`,
		`CREATE TABLE scratch.copies (body text)`,
	} {
		mustExec(t, conn, stmt)
	}
	mustExec(t, conn, `INSERT INTO public.notes VALUES (1, $1), (2, $2)`,
		"Copied from the chat on Tuesday: "+erasedUser+" (end of quote)", "From the live session: "+liveUser)
	mustExec(t, conn, `INSERT INTO archive.exports VALUES ($1, jsonb_build_object('quote', $2::text))`, erasedFact, erasedSummary)
	// Shingles 1 and 3 of the reply: two of four, the threshold.
	mustExec(t, conn, `INSERT INTO public.half_copies VALUES ($1)`, shingleOf(erasedReply, 0)+" and later "+shingleOf(erasedReply, 2))
	// Below it: one word changed in three of the four shingles; a quote of 12 words.
	mustExec(t, conn, `INSERT INTO public.near_copies VALUES ($1), ($2)`,
		edited(erasedReply, 9, 18, 27), strings.Join(strings.Fields(erasedFact)[:12], " "))
	mustExec(t, conn, `INSERT INTO scratch.copies VALUES ($1)`, erasedUser)
	mustExec(t, conn, `INSERT INTO public.people VALUES ($1)`, erasedReply)
}

// TestTextResidueFindsVerbatimCopiesOutsideTheCascade: after A's erasure, the
// probe reports the columns outside the cascade holding a verbatim copy of
// A's text (any schema, text, varchar or jsonb), and not a near-copy below
// the threshold, B's text, B's own rounds, or a schema the store excludes.
func TestTextResidueFindsVerbatimCopiesOutsideTheCascade(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	seedTextResidue(t, dsn)
	e := eraser(t, dsn, "t1")
	e.ProbeExclude = []string{"scratch"}
	req := erasure.Request{UID: "uid-text", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 10, 50)
	if err != nil {
		t.Fatal(err)
	}
	// A's four long texts, sampled before their rows (the session, two
	// rounds, a fact) went; nothing of B.
	if len(res.Texts) != 4 || res.TextRows != 4 {
		t.Fatalf("sampled %d passages from %d rows, want 4 from 4", len(res.Texts), res.TextRows)
	}
	for _, s := range res.Texts {
		if strings.Contains(string(s), "warehouse") {
			t.Errorf("the live session's text was sampled")
		}
	}
	tp, err := e.ProbeTextResidue(ctx, res.Texts)
	if err != nil {
		t.Fatal(err)
	}
	want := []erasure.Residue{
		{Column: "archive.exports.doc", Found: 1},
		{Column: "archive.exports.payload", Found: 1},
		{Column: "public.half_copies.body", Found: 1},
		{Column: "public.notes.body", Found: 1},
		{Column: "public.people.name", Found: 1},
	}
	if diff := cmp.Diff(want, tp.Residue); diff != "" {
		t.Errorf("text residue: -want, +got:\n%s", diff)
	}
	if tp.Excluded != 1 || tp.Unreadable != 0 || tp.Columns < 6 {
		t.Errorf("probed %d columns, %d excluded (want scratch.copies.body), %d unreadable", tp.Columns, tp.Excluded, tp.Unreadable)
	}
	// Nothing of the text in what comes back, even formatted.
	shown := fmt.Sprintf("%v %+v %#v %v", tp, tp, res, res.Texts)
	if _, err := e.ProbeTextResidue(canceled(), res.Texts); err != nil {
		shown += err.Error()
	}
	for _, text := range []string{erasedSummary, erasedUser, erasedReply, erasedFact} {
		for _, w := range []string{"Anna", "Kowalski", "pension", "dementia", "attorney", "Guardian"} {
			if strings.Contains(shown, w) && strings.Contains(text, w) {
				t.Fatalf("%q of the erased text appears in the findings: %s", w, shown)
			}
		}
	}
	// A deletion asked for no probe samples no text.
	none, err := e.Delete(ctx, req, 10, 0)
	if err != nil || len(none.Texts) != 0 {
		t.Errorf("probe budget 0: %d passages sampled (err %v)", len(none.Texts), err)
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestTextResidueAsTheOperatorRole: the manager's role (lethe_operator)
// samples the cascade's text inside the deletion and probes what it may
// read; a table it may not read is counted, not an error.
func TestTextResidueAsTheOperatorRole(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	seedTextResidue(t, dsn)
	admin := connect(t, dsn)
	// memory_derived is granted to the role: a copy there is found (in a
	// profile derived from B, which A's erasure keeps).
	mustExec(t, admin, `WITH p AS (INSERT INTO memory_derived.profiles (tenant_id, kind, summary) VALUES ('t1', 'user', $2) RETURNING id)
		INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, $1 FROM p`, sessB, "Profile: "+erasedReply)
	pool, err := postgres.Connect(ctx, asRole(t, admin, dsn, "lethe_test_operator", "lethe_operator"), postgres.Options{Vector: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e := &postgres.Eraser{Pool: pool, Schema: "memory", TenantID: "t1"}
	req := erasure.Request{UID: "uid-text-role", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 10, 8)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := e.ProbeTextResidue(ctx, res.Texts)
	if err != nil {
		t.Fatalf("probe as lethe_operator: %v", err)
	}
	if diff := cmp.Diff([]erasure.Residue{{Column: "memory_derived.profiles.summary", Found: 1}}, tp.Residue); diff != "" {
		t.Errorf("text residue: -want, +got:\n%s", diff)
	}
	// public.notes, half_copies, near_copies, people, archive.exports (2
	// columns), scratch.copies, lethe.source_releases (2) and
	// lethe.redaction_name_pattern (the names dictionary's pattern, readable
	// only through its function), which the role is not granted either.
	if tp.Unreadable != 10 {
		t.Errorf("%d unreadable columns, want the 10 of the tables not granted to lethe_operator", tp.Unreadable)
	}
}

// TestVectorProbeSkipsWhatTheStoreExcludes: the store's exclusions hold for
// the vector probe too.
func TestVectorProbeSkipsWhatTheStoreExcludes(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	mustExec(t, conn, `CREATE SCHEMA scratch`)
	for _, table := range []string{"public.exported_vectors", "scratch.vectors", "public.kept_vectors"} {
		mustExec(t, conn, `CREATE TABLE `+table+` (v vector(384))`)
		mustExec(t, conn, `INSERT INTO `+table+` SELECT embedding FROM memory.rounds WHERE session_id = $1 LIMIT 1`, sessA)
	}
	e := eraser(t, dsn, "t1")
	e.ProbeExclude = []string{"scratch", "public.kept_vectors"}
	req := erasure.Request{UID: "uid-vec-exclude", SessionIDs: []string{sessA}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 10, 50)
	if err != nil {
		t.Fatal(err)
	}
	residue, err := e.ProbeResidue(ctx, res.Probe, 1e-6)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]erasure.Residue{{Column: "public.exported_vectors.v", Found: 7}}, residue); diff != "" {
		t.Errorf("vector residue: -want, +got:\n%s", diff)
	}
}

// TestTextProbeLeavesAnotherTenantsIdenticalText: tenant t2's entry of the
// same words in a content index that records tenants is t2's data, not a
// copy the erasure of t1's session missed; the same words under a key no
// erasure names are.
func TestTextProbeLeavesAnotherTenantsIdenticalText(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	admin := connect(t, dsn)
	mustExec(t, admin, `INSERT INTO memory.sessions (id, tenant_id) VALUES ($1, 't1'), ($2, 't2')`, sessT1, sessT2)
	mustExec(t, admin, `INSERT INTO memory.rounds (session_id, round_index, user_text, content_sha256) VALUES ($1, 0, $3, 'shared'), ($2, 0, $3, 'shared')`,
		sessT1, sessT2, erasedReply)
	mustExec(t, admin, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids)
		VALUES ('shared', $1, array_fill(0.3, ARRAY[384])::vector, ARRAY['t1', 't2'])`, erasedReply)
	e := eraser(t, dsn, "t1")
	req := erasure.Request{UID: "uid-text-shared", SessionIDs: []string{sessT1}}
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	res, err := e.Delete(ctx, req, 10, 10)
	if err != nil || len(res.Texts) != 1 {
		t.Fatalf("delete: %v, %d passages sampled (want 1)", err, len(res.Texts))
	}
	if tp, err := e.ProbeTextResidue(ctx, res.Texts); err != nil || len(tp.Residue) != 0 {
		t.Errorf("text residue %+v (%v): t2's own entry taken for a copy the erasure missed", tp.Residue, err)
	}
	mustExec(t, admin, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding, tenant_ids)
		VALUES ('copied-under-another-key', $1, array_fill(0.3, ARRAY[384])::vector, ARRAY['t2'])`, erasedReply)
	tp, err := e.ProbeTextResidue(ctx, res.Texts)
	if diff := cmp.Diff([]erasure.Residue{{Column: "memory_derived.embedding_cache.text", Found: 1}}, tp.Residue); err != nil || diff != "" {
		t.Errorf("text residue (%v): -want, +got:\n%s", err, diff)
	}
}
