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
		rep, err := postgres.AuditRedaction(ctx, conn, cols, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	mustExec(t, conn, `UPDATE memory.rounds SET assistant_thinking = 'they wrote to ada@example.org about it' WHERE session_id = $1`, sessA)
	if c := audit(reasoning)[0]; !c.Compliant() || c.Sampled == 0 {
		t.Fatalf("with the trigger in place: %+v, want compliant with rows sampled", c)
	}

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

	mustExec(t, conn, `DROP TRIGGER lethe_redact_assistant_thinking ON memory.rounds`)
	mustExec(t, conn, `CREATE TRIGGER lethe_redact_assistant_thinking BEFORE INSERT ON memory.rounds FOR EACH ROW EXECUTE FUNCTION lethe.redact_row('assistant_thinking')`)
	if c := audit(reasoning)[0]; c.Trigger {
		t.Fatalf("a trigger on INSERT only counted as redacting the column: %+v", c)
	}
	for _, col := range []string{"memory.rounds.user_text", "memory.rounds.no_such_column", "memory.nowhere.text"} {
		if c := audit(col)[0]; c.Trigger || c.Compliant() {
			t.Fatalf("%s: %+v, want not compliant", col, c)
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
