package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/redact"
)

// RedactedColumn is what the redaction audit found of one column.
type RedactedColumn struct {
	// Column is "schema.table.column".
	Column string
	// Exists: the table has the column.
	Exists bool
	// Trigger: a lethe.redact_row trigger redacts the column before every
	// insert and every update, and holds: enabled ALWAYS, unconditional,
	// the last BEFORE ROW trigger to fire, its functions those of the
	// migration. Problem says, when one is there, why it does not hold.
	Trigger bool
	Problem string
	// Sampled rows with a value, and what the detectors found in them
	// (counted in Go with internal/redact: the audit does not trust the
	// database's functions it checks).
	Sampled int
	Found   redact.Counts
	// NotSampled says why the column was not sampled, when it was not.
	NotSampled string
}

// SampleScope is the rows a store's audit may read: with a TenantID, only
// the rows of that tenant's sessions (the sessions table's own, and those
// of a table with a session_id column); a column of any other table is not
// sampled. An empty TenantID reads every row.
type SampleScope struct {
	Sessions Table
	TenantID string
}

// Compliant says the column has its trigger and a sample free of values.
func (c RedactedColumn) Compliant() bool { return c.Exists && c.Trigger && c.Found.Total() == 0 }

// redactionTriggerSQL says whether table $1 has column $2, and what is
// wrong with the best of the BEFORE ROW INSERT and UPDATE triggers that
// run lethe.redact_row with the column among their arguments: NULL when
// there is none, an empty text when it holds. Triggers fire in name order, so one
// that may fire after it (enabled, BEFORE ROW, on insert or update) could
// write the raw value back.
const redactionTriggerSQL = `SELECT a.attnum IS NOT NULL, (
	SELECT CASE
		WHEN t.tgenabled <> 'A' THEN 'not enabled ALWAYS'
		WHEN t.tgqual IS NOT NULL THEN 'a WHEN condition'
		WHEN cardinality(t.tgattr::int2[]) > 0 THEN 'only on updates of some columns'
		WHEN EXISTS (SELECT FROM pg_trigger o WHERE o.tgrelid = c.oid AND NOT o.tgisinternal AND o.tgenabled <> 'D'
			AND o.tgtype & 3 = 3 AND o.tgtype & 20 <> 0 AND o.tgname > t.tgname) THEN 'a BEFORE ROW trigger fires after it'
		ELSE '' END
	FROM pg_trigger t
	WHERE t.tgrelid = c.oid AND t.tgfoid = to_regproc('lethe.redact_row') AND t.tgtype & 23 = 23
	  AND $2 = ANY (string_to_array(rtrim(encode(t.tgargs, 'escape'), '\000'), '\000'))
	ORDER BY t.tgenabled = 'A' AND t.tgqual IS NULL AND cardinality(t.tgattr::int2[]) = 0 DESC, t.tgname DESC
	LIMIT 1)
	FROM pg_class c LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped AND a.attnum > 0
	WHERE c.oid = to_regclass($1)`

// AuditRedaction checks each column ("schema.table.column") for its
// redaction trigger and samples at most sample of its values (pages drawn
// at random, TABLESAMPLE SYSTEM) for values the detectors, and the names
// dictionary, find. The values stay in memory here; only counts leave.
func AuditRedaction(ctx context.Context, q Querier, columns []string, sample int, scope SampleScope) ([]RedactedColumn, error) {
	intact, err := redactionFunctionsIntact(ctx, q)
	if err != nil {
		return nil, err
	}
	names, err := readDictionary(ctx, q)
	if err != nil {
		return nil, err
	}
	dict := redact.NewNames(names)
	out := make([]RedactedColumn, 0, len(columns))
	for _, col := range columns {
		rc, err := auditRedactedColumn(ctx, q, col, intact, dict, sample, scope)
		if err != nil {
			return nil, err
		}
		out = append(out, rc)
	}
	return out, nil
}

// auditRedactedColumn checks one column's trigger and samples its values.
func auditRedactedColumn(ctx context.Context, q Querier, col string, intact bool, dict *redact.Names, sample int, scope SampleScope) (RedactedColumn, error) {
	parts := strings.Split(col, ".")
	if len(parts) != 3 {
		return RedactedColumn{}, fmt.Errorf("redacted column %q is not schema.table.column", col)
	}
	table := pgx.Identifier{parts[0], parts[1]}.Sanitize()
	rc := RedactedColumn{Column: col, Found: redact.Counts{}}
	var problem *string
	err := q.QueryRow(ctx, redactionTriggerSQL, table, parts[2]).Scan(&rc.Exists, &problem)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return RedactedColumn{}, fmt.Errorf("read the redaction trigger of %s: %w", col, err)
	}
	switch {
	case problem == nil:
	case *problem != "":
		rc.Problem = *problem
	case !intact:
		rc.Problem = "the redaction functions differ from migration 00014's"
	default:
		rc.Trigger = true
	}
	switch {
	case !rc.Exists:
	case sample <= 0:
		rc.NotSampled = "sampling is off"
	default:
		values, why, err := scope.sample(ctx, q, Table{Schema: parts[0], Name: parts[1]}, parts[2], sample)
		if err != nil {
			return RedactedColumn{}, fmt.Errorf("sample %s: %w", col, err)
		}
		rc.NotSampled = why
		for _, v := range values {
			rc.Sampled++
			_, found := redact.TextWithNames(v, dict)
			for name, k := range found {
				rc.Found[name] += k
			}
		}
	}
	return rc, nil
}

// readDictionary reads the names dictionary (none before migration 00014).
func readDictionary(ctx context.Context, q Querier) ([]string, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('lethe.redaction_names') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	var names []string
	if err := q.QueryRow(ctx, `SELECT coalesce(array_agg(name), '{}') FROM lethe.redaction_names`).Scan(&names); err != nil {
		return nil, fmt.Errorf("read the names dictionary: %w", err)
	}
	return names, nil
}

// syncGraphNamesSQL makes the graph-fed names of the dictionary exactly
// $1 (a platform name stays the platform's), leaving out names the
// table's check refuses, by the same expression, rather than failing.
const syncGraphNamesSQL = `WITH wanted AS (
		SELECT DISTINCT n AS name FROM unnest($1::text[]) n
		WHERE length(n) BETWEEN 2 AND 100 AND n ~ '^[[:alpha:]]' AND n ~ '[[:alpha:]]$' AND n !~ '[][\\^$*+?(){}|[:cntrl:]]'),
	gone AS (DELETE FROM lethe.redaction_names r WHERE r.source = 'graph' AND r.name NOT IN (SELECT name FROM wanted) RETURNING 1),
	added AS (INSERT INTO lethe.redaction_names (name, source) SELECT name, 'graph' FROM wanted
		ON CONFLICT (name) DO NOTHING RETURNING 1)
	SELECT (SELECT count(*) FROM added), (SELECT count(*) FROM gone), (SELECT count(*) FROM wanted)`

// SyncGraphNames makes the names dictionary's graph-fed names those of
// the graph's person entities: added and removed count the changes, kept
// the names the dictionary accepted. Names are never logged.
func SyncGraphNames(ctx context.Context, db DB, names []string) (added, removed, kept int64, err error) {
	err = db.QueryRow(ctx, syncGraphNamesSQL, names).Scan(&added, &removed, &kept)
	if err != nil {
		err = fmt.Errorf("sync the names dictionary with the graph: %w", err)
	}
	return added, removed, kept, err
}
