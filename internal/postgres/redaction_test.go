package postgres_test

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/redact"
	"github.com/lethe-dev/lethe/internal/redact/redacttest"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// The database's redactor (generated from internal/redact) gives the Go
// redactor's output, text and counts, on the regression corpus: the two
// cannot drift.
func TestTheDatabaseRedactsAsTheGoRedactorDoes(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	corpus := redacttest.Corpus(77, 1500)
	texts := make([]string, len(corpus))
	for i, tr := range corpus {
		texts[i] = tr.Text
	}
	rows, err := conn.Query(ctx, `SELECT r.redacted, r.counts FROM unnest($1::text[]) WITH ORDINALITY u(t, i),
		LATERAL lethe.redact_counted(u.t) r ORDER BY u.i`, texts)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	i, differ := 0, 0
	for rows.Next() {
		var got string
		var raw []byte
		if err := rows.Scan(&got, &raw); err != nil {
			t.Fatal(err)
		}
		var counts redact.Counts
		if err := json.Unmarshal(raw, &counts); err != nil {
			t.Fatal(err)
		}
		want, wantCounts := redact.Text(texts[i])
		if got != want || !maps.Equal(counts, wantCounts) {
			if differ++; differ <= 5 {
				t.Errorf("trace %d: the database's redaction differs from Go's:\n sql: %q %v\n go:  %q %v", i, got, counts, want, wantCounts)
			}
		}
		i++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if i != len(texts) || differ > 0 {
		t.Fatalf("%d of %d traces compared, %d differ", i, len(texts), differ)
	}
}

// Through the application role, an insert and an update of the reasoning
// column store only redacted text, for a value of every detector.
func TestTheReasoningColumnIsRedactedAtInsertAndUpdate(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	app := connect(t, asRole(t, conn, dsn, "redaction_app", "memory_app"))
	samples := map[string]string{}
	for _, tr := range redacttest.Corpus(5, 400) {
		for _, p := range tr.Planted {
			if p.Detector != "" {
				samples[p.Detector] = p.Value
			}
		}
	}
	for _, d := range redacttest.Detectors() {
		if samples[d] == "" {
			t.Fatalf("the corpus planted no %s value", d)
		}
	}
	for i, d := range redacttest.Detectors() {
		v := samples[d]
		thought := "I notice " + v + " in what they wrote; I should not repeat it."
		if _, err := app.Exec(ctx, `INSERT INTO memory.rounds (session_id, round_index, user_text, assistant_thinking) VALUES ($1, $2, 'q', $3)`,
			sessA, 100+i, thought); err != nil {
			t.Fatalf("%s: insert as the application: %v", d, err)
		}
		if _, err := app.Exec(ctx, `INSERT INTO memory.rounds (session_id, round_index, user_text, assistant_thinking) VALUES ($1, $2, 'q', 'nothing yet')`,
			sessA, 200+i); err != nil {
			t.Fatal(err)
		}
		if _, err := app.Exec(ctx, `UPDATE memory.rounds SET assistant_thinking = $3 WHERE session_id = $1 AND round_index = $2`,
			sessA, 200+i, thought); err != nil {
			t.Fatalf("%s: update as the application: %v", d, err)
		}
		for _, idx := range []int{100 + i, 200 + i} {
			var stored string
			if err := conn.QueryRow(ctx, `SELECT assistant_thinking FROM memory.rounds WHERE session_id = $1 AND round_index = $2`, sessA, idx).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(stored, v) || !strings.Contains(stored, placeholderOf(d)) {
				t.Errorf("%s: stored %q (round %d), want the value replaced by %s", d, stored, idx, placeholderOf(d))
			}
		}
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.rounds WHERE assistant_thinking LIKE '%' || $1 || '%'`, samples["email"]); n != 0 {
		t.Fatalf("%d rows hold the raw email", n)
	}
}

// A trigger of the table's own that sets the reasoning column on an
// update naming only other columns (it fires before the redaction trigger,
// by name) does not get a raw value stored: the redaction trigger fires on
// every update.
func TestAnUpdateOfOtherColumnsIsRedactedToo(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	mustExec(t, conn, `CREATE FUNCTION public.copy_question() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN NEW.assistant_thinking := 'they asked: ' || NEW.user_text; RETURN NEW; END $$`)
	mustExec(t, conn, `CREATE TRIGGER a_copy_question BEFORE UPDATE ON memory.rounds FOR EACH ROW EXECUTE FUNCTION public.copy_question()`)
	app := connect(t, asRole(t, conn, dsn, "redaction_app", "memory_app"))
	tag, err := app.Exec(ctx, `UPDATE memory.rounds SET user_text = 'mail grace@example.org' WHERE session_id = $1`, sessA)
	if err != nil || tag.RowsAffected() == 0 {
		t.Fatalf("update as the application: %v, %d rows", err, tag.RowsAffected())
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.rounds WHERE session_id = $1 AND assistant_thinking = 'they asked: mail [email]'`, sessA); n == 0 {
		t.Fatal("no row redacted")
	}
	if n := count(t, conn, `SELECT count(*) FROM memory.rounds WHERE strpos(assistant_thinking, 'grace@example.org') > 0`); n != 0 {
		t.Fatalf("%d rows store the raw address set by another trigger", n)
	}
}

// lethe.redact_batch runs as its owner: it refuses a table a caller made
// (whose own triggers would then run with the owner's rights) even with
// the redaction trigger on it, and a column its owner never declared
// redacted with lethe.redact_column.
func TestRedactBatchRefusesColumnsTheOwnerDidNotDeclare(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	mdsn, err := testenv.ManagerDSN(ctx, dsn, true)
	if err != nil {
		t.Fatal(err)
	}
	manager := connect(t, mdsn)
	mustExec(t, conn, `CREATE TABLE public.escalated (done boolean)`)
	mustExec(t, manager, `CREATE TEMP TABLE bait (body text)`)
	mustExec(t, manager, `CREATE FUNCTION pg_temp.grab() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO public.escalated VALUES (true); RETURN NEW; END $$`)
	mustExec(t, manager, `INSERT INTO bait VALUES ('mail ada@example.org')`)
	mustExec(t, manager, `CREATE TRIGGER a_grab BEFORE UPDATE ON bait FOR EACH ROW EXECUTE FUNCTION pg_temp.grab()`)
	mustExec(t, manager, `CREATE TRIGGER lethe_redact_body BEFORE INSERT OR UPDATE ON bait FOR EACH ROW EXECUTE FUNCTION lethe.redact_row('body')`)
	var oid uint32
	if err := manager.QueryRow(ctx, `SELECT 'pg_temp.bait'::regclass::oid`).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	_, err = manager.Exec(ctx, `SELECT * FROM lethe.redact_batch($1::oid::regclass, 'body', 0, 10, false)`, oid)
	if err == nil || !strings.Contains(err.Error(), "LE005") {
		t.Fatalf("redact_batch on the caller's temporary table: %v, want LE005", err)
	}
	if n := count(t, conn, `SELECT count(*) FROM public.escalated`); n != 0 {
		t.Fatalf("the caller's trigger ran %d times as redact_batch's owner", n)
	}
	// The owner's column with the trigger but not declared.
	mustExec(t, conn, `CREATE TRIGGER lethe_redact_user_text BEFORE INSERT OR UPDATE ON memory.rounds FOR EACH ROW EXECUTE FUNCTION lethe.redact_row('user_text')`)
	if _, err := manager.Exec(ctx, `SELECT * FROM lethe.redact_batch('memory.rounds', 'user_text', 0, 10, true)`); err == nil || !strings.Contains(err.Error(), "LE005") {
		t.Fatalf("redact_batch on a column never declared redacted: %v, want LE005", err)
	}
	if _, err := manager.Exec(ctx, `SELECT lethe.redact_column('memory.rounds', 'user_text')`); err == nil {
		t.Fatal("the manager's role declared a column redacted; only the owner may")
	}
	mustExec(t, conn, `SELECT lethe.redact_column('memory.rounds', 'user_text')`)
	if _, err := manager.Exec(ctx, `SELECT * FROM lethe.redact_batch('memory.rounds', 'user_text', 0, 10, true)`); err != nil {
		t.Fatalf("redact_batch on a declared column: %v", err)
	}
}

func placeholderOf(detector string) string {
	for _, d := range redact.Detectors {
		if d.Name == detector {
			return d.Placeholder
		}
	}
	return "?"
}

// The audit names a column without the trigger (dropped, disabled, or one
// that never had it) and counts, per detector, the values a sample holds.
func TestTheRedactionAuditFlagsAMissingTriggerAndLeakedValues(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	seedTenants(t, conn)
	const reasoning = "memory.rounds.assistant_thinking"
	audit := func(cols ...string) []postgres.RedactedColumn {
		t.Helper()
		rep, err := postgres.AuditRedaction(ctx, conn, cols, 1000, postgres.SampleScope{})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	mustExec(t, conn, `UPDATE memory.rounds SET assistant_thinking = 'they wrote to ada@example.org about it' WHERE session_id = $1`, sessA)
	if c := audit(reasoning)[0]; !c.Compliant() || c.Sampled == 0 {
		t.Fatalf("with the trigger in place: %+v, want compliant with rows sampled", c)
	}
	// A name stored before the dictionary had it is found with the
	// dictionary's names, as kubectl erasure redact would redact it.
	mustExec(t, conn, `UPDATE memory.rounds SET assistant_thinking = 'Grace Hopper asked again' WHERE session_id = $1 AND round_index = 0`, sessA)
	mustExec(t, conn, `INSERT INTO lethe.redaction_names (name, source) VALUES ('Grace Hopper', 'platform')`)
	if c := audit(reasoning)[0]; c.Compliant() || c.Found[redact.PersonDetector] != 1 {
		t.Fatalf("a name stored before the dictionary had it: %+v, want 1 person found", c)
	}
	mustExec(t, conn, `DELETE FROM lethe.redaction_names`)

	mustExec(t, conn, `ALTER TABLE memory.rounds DISABLE TRIGGER lethe_redact_assistant_thinking`)
	mustExec(t, conn, `UPDATE memory.rounds SET assistant_thinking = 'mail ada@example.org, card 4111 1111 1111 1111' WHERE session_id = $1`, sessB)
	c := audit(reasoning)[0]
	if c.Trigger || c.Found["email"] != 3 || c.Found["card"] != 3 || c.Compliant() {
		t.Fatalf("trigger disabled, three rows leaked: %+v, want no trigger and 3 emails, 3 cards", c)
	}
	mustExec(t, conn, `ALTER TABLE memory.rounds ENABLE ALWAYS TRIGGER lethe_redact_assistant_thinking`)
	if c := audit(reasoning)[0]; !c.Trigger || c.Compliant() {
		t.Fatalf("trigger back, the leaked rows still there: %+v, want the trigger found and the column not compliant", c)
	}

	// Each way a trigger is there and yet does not hold.
	for _, tc := range []struct{ name, ddl, undo, problem string }{
		{"enabled only outside replication", `ALTER TABLE memory.rounds ENABLE TRIGGER lethe_redact_assistant_thinking`,
			`ALTER TABLE memory.rounds ENABLE ALWAYS TRIGGER lethe_redact_assistant_thinking`, "not enabled ALWAYS"},
		{"a later BEFORE ROW trigger", `CREATE TRIGGER zz_touch BEFORE UPDATE ON memory.rounds FOR EACH ROW EXECUTE FUNCTION lethe.redact_row('user_text')`,
			`DROP TRIGGER zz_touch ON memory.rounds`, "a BEFORE ROW trigger fires after it"},
		{"a replaced function", `CREATE OR REPLACE FUNCTION lethe.redact_text(t text) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$ SELECT t $$`,
			`SELECT 1`, "the redaction functions differ from migration 00014's"},
	} {
		mustExec(t, conn, tc.ddl)
		if c := audit(reasoning)[0]; c.Trigger || c.Problem != tc.problem {
			t.Fatalf("%s: %+v, want the trigger not holding: %s", tc.name, c, tc.problem)
		}
		mustExec(t, conn, tc.undo)
	}
	for _, tc := range []struct{ name, trigger, problem string }{
		{"on INSERT only", `BEFORE INSERT ON memory.rounds FOR EACH ROW`, ""},
		{"on updates of the column only", `BEFORE INSERT OR UPDATE OF assistant_thinking ON memory.rounds FOR EACH ROW`, "only on updates of some columns"},
		{"with a WHEN condition", `BEFORE INSERT OR UPDATE ON memory.rounds FOR EACH ROW WHEN (NEW.round_index < 1000)`, "a WHEN condition"},
	} {
		mustExec(t, conn, `DROP TRIGGER lethe_redact_assistant_thinking ON memory.rounds`)
		mustExec(t, conn, `CREATE TRIGGER lethe_redact_assistant_thinking `+tc.trigger+` EXECUTE FUNCTION lethe.redact_row('assistant_thinking')`)
		mustExec(t, conn, `ALTER TABLE memory.rounds ENABLE ALWAYS TRIGGER lethe_redact_assistant_thinking`)
		if c := audit(reasoning)[0]; c.Trigger || c.Problem != tc.problem {
			t.Fatalf("a trigger %s: %+v, want it not counted (%q)", tc.name, c, tc.problem)
		}
	}
	for _, col := range []string{"memory.rounds.user_text", "memory.rounds.no_such_column", "memory.nowhere.text"} {
		if c := audit(col)[0]; c.Trigger || c.Compliant() {
			t.Fatalf("%s: %+v, want not compliant", col, c)
		}
	}
}

// A store with a tenant reads only its tenant's rows: another tenant's
// leaked values are neither read nor counted, and a column of a table not
// tied to sessions is not sampled at all.
func TestTheRedactionAuditSamplesOnlyTheStoresTenant(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	seedTenants(t, conn)
	mustExec(t, conn, `UPDATE memory.rounds SET assistant_thinking = 'nothing to hide' WHERE session_id = $1`, sessA)
	mustExec(t, conn, `ALTER TABLE memory.rounds DISABLE TRIGGER lethe_redact_assistant_thinking`)
	mustExec(t, conn, `UPDATE memory.rounds SET assistant_thinking = 'mail ada@example.org' WHERE session_id = $1`, sessC)
	mustExec(t, conn, `ALTER TABLE memory.rounds ENABLE ALWAYS TRIGGER lethe_redact_assistant_thinking`)
	mustExec(t, conn, `SELECT lethe.redact_column('memory_derived.profiles', 'summary')`)
	sessions := postgres.Table{Schema: "memory", Name: "sessions"}
	audit := func(tenant string) []postgres.RedactedColumn {
		t.Helper()
		rep, err := postgres.AuditRedaction(ctx, conn, []string{"memory.rounds.assistant_thinking", "memory_derived.profiles.summary"},
			1000, postgres.SampleScope{Sessions: sessions, TenantID: tenant})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	for _, tc := range []struct {
		tenant  string
		sampled int
		emails  int
	}{{"t1", 3, 0}, {"t2", 3, 3}, {"t3", 0, 0}, {"", 6, 3}} {
		rep := audit(tc.tenant)
		if c := rep[0]; c.Sampled != tc.sampled || c.Found["email"] != tc.emails || c.NotSampled != "" {
			t.Errorf("tenant %q: %+v, want %d values sampled, %d e-mails", tc.tenant, c, tc.sampled, tc.emails)
		}
		profiles := rep[1]
		switch {
		case tc.tenant != "" && (profiles.Sampled != 0 || profiles.NotSampled == ""):
			t.Errorf("tenant %q: a table with no session_id was sampled: %+v", tc.tenant, profiles)
		case tc.tenant == "" && profiles.Sampled == 0:
			t.Errorf("no tenant: the profiles were not sampled: %+v", profiles)
		}
	}
}

// Rows written before the trigger are redacted in bounded batches, each
// with its receipt, as the manager's role (lethe.redact_batch is SECURITY
// DEFINER); a dry run changes nothing and counts what the real run then
// redacts; a repeat changes nothing; a column without the trigger is
// refused.
func TestRedactingRowsWrittenBeforeTheTrigger(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	seedTenants(t, conn)
	mustExec(t, conn, `ALTER TABLE memory.rounds DISABLE TRIGGER lethe_redact_assistant_thinking`)
	corpus := redacttest.Corpus(11, 600)
	want := redact.Counts{}
	for i, tr := range corpus {
		mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text, assistant_thinking) VALUES ($1, $2, 'q', $3)`, sessB, 1000+i, tr.Text)
		_, c := redact.Text(tr.Text)
		for k, n := range c {
			want[k] += n
		}
	}
	mustExec(t, conn, `ALTER TABLE memory.rounds ENABLE ALWAYS TRIGGER lethe_redact_assistant_thinking`)
	mdsn, err := testenv.ManagerDSN(ctx, dsn, true)
	if err != nil {
		t.Fatal(err)
	}
	manager := eraser(t, mdsn, "").Pool

	before := snapshot(t, conn)
	dry, err := postgres.RedactColumn(ctx, manager, "memory.rounds.assistant_thinking", 8, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, conn); !maps.Equal(before, after) {
		t.Fatal("the dry run changed the database")
	}
	if dry.Batches < 3 || dry.RowsChanged == 0 || !maps.Equal(dry.Counts, want) {
		t.Fatalf("dry run: %+v, want several batches and the Go redactor's counts %v", dry, want)
	}

	run, err := postgres.RedactColumn(ctx, manager, "memory.rounds.assistant_thinking", 8, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if run.RowsChanged != dry.RowsChanged || !maps.Equal(run.Counts, dry.Counts) {
		t.Fatalf("run %+v, dry run %+v: want the same rows and counts", run, dry)
	}
	for _, tr := range corpus {
		for _, p := range tr.Planted {
			if p.Detector != "" {
				if n := count(t, conn, `SELECT count(*) FROM memory.rounds WHERE strpos(assistant_thinking, $1) > 0`, p.Value); n != 0 {
					t.Fatalf("a %s value is still stored in %d rows after the redaction", p.Detector, n)
				}
			}
		}
	}
	receipts := count(t, conn, `SELECT count(*) FROM lethe.redaction_receipts`)
	if rows := count(t, conn, `SELECT coalesce(sum(rows_changed), 0) FROM lethe.redaction_receipts`); receipts < 2 || rows != run.RowsChanged {
		t.Fatalf("%d receipts for %d rows, want several for %d", receipts, rows, run.RowsChanged)
	}

	again, err := postgres.RedactColumn(ctx, manager, "memory.rounds.assistant_thinking", 8, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.RowsChanged != 0 || count(t, conn, `SELECT count(*) FROM lethe.redaction_receipts`) != receipts {
		t.Fatalf("a repeat changed %d rows or wrote receipts", again.RowsChanged)
	}
	if _, err := postgres.RedactColumn(ctx, manager, "memory.rounds.user_text", 8, false, nil); err == nil || !strings.Contains(err.Error(), "LE005") {
		t.Fatalf("redacting a column without the trigger: %v, want LE005", err)
	}
}

// The names dictionary: whole words, any case, the longest name where
// several start at one place; the database and the Go redactor agree.
func TestTheNamesDictionaryRedactsWholeNamesAsGoDoes(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	names := []string{"Ada", "Ada Lovelace", "Grace", "Jean-Luc", "O'Neil", "José Núñez"}
	for _, n := range names {
		mustExec(t, conn, `INSERT INTO lethe.redaction_names (name, source) VALUES ($1, 'platform')`, n)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO lethe.redaction_names (name, source) VALUES ('x|.*', 'platform')`); err == nil {
		t.Fatal("a name with pattern characters was accepted")
	}
	dict := redact.NewNames(names)
	cases := map[string]string{
		"I think Ada Lovelace wrote to ada about it": "I think [person] wrote to [person] about it",
		"Adanac and gracefully stay; GRACE does not": "Adanac and gracefully stay; [person] does not",
		"ask Jean-Luc or o'neil, then José Núñez.":   "ask [person] or [person], then [person].",
		"ada_x and xada stay, (ada) and ada, go":     "ada_x and xada stay, ([person]) and [person], go",
		"mail ada@example.org, Ada's notes":          "mail [email], [person]'s notes",
	}
	texts := []string{}
	for in := range cases {
		texts = append(texts, in)
	}
	for _, tr := range redacttest.Corpus(31, 300) {
		texts = append(texts, tr.Text+" Ada Lovelace and grace said so.")
	}
	for _, in := range texts {
		var got string
		var raw []byte
		if err := conn.QueryRow(ctx, `SELECT redacted, counts FROM lethe.redact_counted($1)`, in).Scan(&got, &raw); err != nil {
			t.Fatal(err)
		}
		var counts redact.Counts
		if err := json.Unmarshal(raw, &counts); err != nil {
			t.Fatal(err)
		}
		want, wantCounts := redact.TextWithNames(in, dict)
		if got != want || !maps.Equal(counts, wantCounts) {
			t.Fatalf("%q:\n sql %q %v\n go  %q %v", in, got, counts, want, wantCounts)
		}
		if exp, ok := cases[in]; ok && got != exp {
			t.Errorf("%q redacted to %q, want %q", in, got, exp)
		}
	}
}

// Two transactions adding names at once, the second's statement trigger
// waiting for the first's commit: the pattern holds both names after both
// commit (the second rebuilds it from a snapshot taken after the wait).
func TestConcurrentDictionaryChangesKeepEveryName(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	first, second := connect(t, dsn), connect(t, dsn)
	mustExec(t, first, `BEGIN`)
	mustExec(t, first, `INSERT INTO lethe.redaction_names (name, source) VALUES ('Ada Lovelace', 'platform')`)
	mustExec(t, second, `BEGIN`)
	done := make(chan error, 1)
	go func() {
		_, err := second.Exec(ctx, `INSERT INTO lethe.redaction_names (name, source) VALUES ('Grace Hopper', 'platform')`)
		done <- err
	}()
	waitForLock(t, conn, "INSERT INTO lethe.redaction_names%Grace%")
	mustExec(t, first, `COMMIT`)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mustExec(t, second, `COMMIT`)
	var pattern string
	if err := conn.QueryRow(ctx, `SELECT pattern FROM lethe.redaction_name_pattern`).Scan(&pattern); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ada lovelace", "grace hopper"} {
		if !strings.Contains(pattern, name) {
			t.Errorf("the pattern lacks %q after both transactions committed", name)
		}
	}
}

// A small tenant of a large table is sampled: the sample is sized by the
// tenant's sessions, not the table's rows (sized by the table, 5 values of
// 30,000 rows read a fraction of one page, and the tenant's leaked values
// went unread). Each kind of table is covered: the sessions table, a table
// with an index on session_id, and one without.
func TestASmallTenantOfALargeTableIsSampled(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	seedTenants(t, conn)
	mustExec(t, conn, `CREATE TABLE memory_derived.notes (session_id uuid, note text)`)
	mustExec(t, conn, `SELECT lethe.redact_column('memory.sessions', 'summary')`)
	mustExec(t, conn, `SELECT lethe.redact_column('memory_derived.notes', 'note')`)
	mustExec(t, conn, `WITH s AS (INSERT INTO memory.sessions (id, tenant_id, summary)
			SELECT gen_random_uuid(), 'big', 'plain words' FROM generate_series(1, 30000) RETURNING id),
		r AS (INSERT INTO memory.rounds (session_id, round_index, assistant_thinking) SELECT id, 0, 'plain words' FROM s)
		INSERT INTO memory_derived.notes SELECT id, 'plain words' FROM s`)
	for _, tr := range []string{"memory.rounds lethe_redact_assistant_thinking", "memory.sessions lethe_redact_summary", "memory_derived.notes lethe_redact_note"} {
		f := strings.Fields(tr)
		mustExec(t, conn, `ALTER TABLE `+f[0]+` DISABLE TRIGGER `+f[1])
	}
	mustExec(t, conn, `UPDATE memory.rounds SET assistant_thinking = 'mail ada@example.org' WHERE session_id = $1`, sessC)
	mustExec(t, conn, `UPDATE memory.sessions SET summary = 'mail ada@example.org' WHERE id = $1`, sessC)
	mustExec(t, conn, `INSERT INTO memory_derived.notes VALUES ($1, 'mail ada@example.org')`, sessC)
	for _, tr := range []string{"memory.rounds lethe_redact_assistant_thinking", "memory.sessions lethe_redact_summary", "memory_derived.notes lethe_redact_note"} {
		f := strings.Fields(tr)
		mustExec(t, conn, `ALTER TABLE `+f[0]+` ENABLE ALWAYS TRIGGER `+f[1])
	}
	mustExec(t, conn, `ANALYZE`)

	cols := []string{"memory.sessions.summary", "memory.rounds.assistant_thinking", "memory_derived.notes.note"}
	scope := postgres.SampleScope{Sessions: postgres.Table{Schema: "memory", Name: "sessions"}, TenantID: "t2"}
	rep, err := postgres.AuditRedaction(ctx, conn, cols, 5, scope)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{1, 3, 1} {
		if c := rep[i]; c.Sampled != want || c.Found["email"] != want || c.NotSampled != "" {
			t.Errorf("%s: %+v, want the tenant's %d values sampled, each an e-mail", cols[i], c, want)
		}
	}
	// The big tenant's sample is a sample: at most 5 values a column, none leaked.
	scope.TenantID = "big"
	if rep, err = postgres.AuditRedaction(ctx, conn, cols, 5, scope); err != nil {
		t.Fatal(err)
	}
	for i, c := range rep {
		if c.Sampled == 0 || c.Sampled > 5 || c.Found.Total() != 0 {
			t.Errorf("tenant big, %s: %+v, want 1-5 clean values", cols[i], c)
		}
	}
}
