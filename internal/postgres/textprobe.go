package postgres

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// The text residue probe looks for verbatim copies of erased text outside
// the cascade. The deletion samples passages (the first passageWords words
// of a text value); the probe cuts each passage into consecutive,
// non-overlapping shingles of shingleWords words and counts a value
// outside the cascade as a copy of the passage when it holds at least
// half of the passage's shingles, and never fewer than two (16 words of
// the passage, verbatim): a shared common phrase, a quote of a few words
// or a copy edited in every shingle is not a copy. Matching is by
// substring (strpos), so a copy must keep the words and the separators
// between them; case and re-wrapped whitespace are not normalized.
//
// Cost (BenchmarkP1TextProbe): one scan of every text column outside the
// cascade, and per value one substring search per shingle (at most
// TextProbeBudget x 4), linear in the bytes searched. Shingle count, not
// length, drives it, hence passages of 4 shingles.
const (
	shingleWords = 8
	passageWords = 4 * shingleWords
	// sampleChars bounds what the deletion reads of each value (a prefix,
	// so a long value is never read whole).
	sampleChars = 1024
	// copyShare is the share of a passage's shingles a copy holds.
	copyShare = 0.5
)

// textColumnsSQL lists every text-like column of every schema (string
// types, json and jsonb), and whether the current role may read it.
// Partitions are left out: their parent's scan reads them.
const textColumnsSQL = `SELECT n.nspname, c.relname, a.attname, t.typcategory = 'S',
		has_schema_privilege(n.oid, 'USAGE') AND has_column_privilege(c.oid, a.attnum, 'SELECT')
	FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	JOIN pg_type t ON t.oid = a.atttypid
	WHERE (t.typcategory = 'S' AND t.typname <> 'name' OR t.typname IN ('json', 'jsonb'))
	  AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND a.attnum > 0 AND NOT a.attisdropped
	  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
	ORDER BY 1, 2, 3`

// textColumn is a text-like column: a string type (else json), readable
// by the current role or not.
type textColumn struct {
	col               QColumn
	isString, canRead bool
}

func textColumns(ctx context.Context, q Querier) ([]textColumn, error) {
	rows, err := q.Query(ctx, textColumnsSQL)
	if err != nil {
		return nil, fmt.Errorf("list text columns: %w", err)
	}
	var cols []textColumn
	var c textColumn
	if _, err := pgx.ForEachRow(rows, []any{&c.col.Table.Schema, &c.col.Table.Name, &c.col.Column, &c.isString, &c.canRead}, func() error {
		cols = append(cols, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list text columns: %w", err)
	}
	return cols, nil
}

// cascadeTexts are the string columns of sessions and the tables cascading
// from it that the role may read: the deletion samples them.
func cascadeTexts(ctx context.Context, q Querier, l Layout) ([]QColumn, error) {
	cols, err := textColumns(ctx, q)
	if err != nil {
		return nil, err
	}
	members := l.inCascade()
	var out []QColumn
	for _, c := range cols {
		if members[c.col.Table] && c.isString && c.canRead {
			out = append(out, c.col)
		}
	}
	return out, nil
}

// enoughWords is a LIKE pattern for a value with at least
// TextPassageMinWords-1 spaces: the cheap test for enough words (a regular
// expression cost 10 times more per value); passage() counts the words.
var enoughWords = strings.Repeat("% ", erasure.TextPassageMinWords-1) + "%"

// textTables groups the cascade's string columns by table (they come
// sorted), so that each table is read once.
func (l Layout) textTables() [][]QColumn {
	var out [][]QColumn
	for _, c := range l.Texts {
		if n := len(out); n > 0 && out[n-1][0].Table == c.Table {
			out[n-1] = append(out[n-1], c)
			continue
		}
		out = append(out, []QColumn{c})
	}
	return out
}

// prefix is the SQL for the first sampleChars characters of column c: the
// value itself when it is that short (substr walks every character of a
// value: three times the LIKE test's cost on P1's rows). COLLATE "C" lets
// LIKE run on a column of a nondeterministic collation.
func prefix(c string) string {
	n := strconv.Itoa(sampleChars)
	return `(CASE WHEN octet_length(` + c + `) <= ` + n + ` THEN ` + c + ` ELSE substr(` + c + `, 1, ` + n + `) END) COLLATE "C"`
}

// sampleTextsSQL reads the prefix of at most $2 values of the sessions $1
// with enough words ($3), from the string columns of the cascade, one read
// per table; every table's first value comes before any table's second,
// so that the sample spreads over the tables. The test is in the table
// scan, so that only rows with a long value go on (testing every value
// after the scan cost 8 times more on P1's short rows, where none does).
func sampleTextsSQL(l Layout) string {
	var sel []string
	for _, cols := range l.textTables() {
		t := cols[0].Table
		vals := make([]string, len(cols))
		long := make([]string, len(cols))
		for i, c := range cols {
			vals[i] = `(` + strconv.Itoa(i) + `, ` + prefix(`t.`+c.Ident()) + `)`
			long[i] = prefix(c.Ident()) + ` LIKE $3`
		}
		sel = append(sel, `(SELECT x.v, row_number() OVER () AS n, x.k FROM (SELECT * FROM `+t.Ident()+` WHERE `+l.sessionKey(t)+
			` = ANY($1::uuid[]) AND (`+strings.Join(long, " OR ")+`) LIMIT $2) t CROSS JOIN LATERAL (VALUES `+
			strings.Join(vals, ", ")+`) x(k, v) WHERE x.v LIKE $3)`)
	}
	return `SELECT v FROM (` + strings.Join(sel, " UNION ALL ") + `) s ORDER BY n, k LIMIT $2`
}

// textRows sums the deleted rows of the tables the text sample reads.
func textRows(l Layout, deleted []erasure.Count) int64 {
	read := map[string]bool{}
	for _, c := range l.Texts {
		read[c.Table.String()] = true
	}
	var n int64
	for _, c := range deleted {
		if read[c.Table] {
			n += c.Rows
		}
	}
	return n
}

// queueTextSample samples at most budget passages of the sessions' text
// into s, before the deletes.
func queueTextSample(p *pipeline, l Layout, eligible []string, budget int, s *batchSample) {
	if budget <= 0 || len(l.Texts) == 0 {
		return
	}
	p.query("sample texts", sampleTextsSQL(l), []any{eligible, budget, enoughWords}, func(rows pgx.Rows) error {
		vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, v := range vs {
			if ps := passage(v); ps != "" {
				s.texts = append(s.texts, erasure.TextSample(ps))
			}
		}
		return err
	})
}

// wordSpans returns the byte spans [start, end) of the first max words of s.
func wordSpans(s string, max int) [][2]int {
	var out [][2]int
	start := -1
	for i, r := range s {
		switch {
		case !unicode.IsSpace(r) && start < 0:
			start = i
		case unicode.IsSpace(r) && start >= 0:
			out = append(out, [2]int{start, i})
			start = -1
			if len(out) == max {
				return out
			}
		}
	}
	if start >= 0 {
		out = append(out, [2]int{start, len(s)})
	}
	return out
}

// passage is the first passageWords words of s, separators as s has them;
// "" when s has fewer than TextPassageMinWords words.
func passage(s string) string {
	w := wordSpans(s, passageWords)
	if len(w) < erasure.TextPassageMinWords {
		return ""
	}
	return s[w[0][0]:w[len(w)-1][1]]
}

// shingles cuts p into consecutive runs of shingleWords words, each the
// exact substring of p (separators included), so that a verbatim copy
// holds it byte for byte; a shorter last run is dropped.
func shingles(p string) []string {
	w := wordSpans(p, passageWords)
	var out []string
	for i := 0; i+shingleWords <= len(w); i += shingleWords {
		out = append(out, p[w[i][0]:w[i+shingleWords-1][1]])
	}
	return out
}

// shingleSet is the probe's parameters: every shingle, the passage it
// comes from, and how many of that passage's shingles a copy holds.
type shingleSet struct {
	shingles []string
	passage  []int32
	need     []int32
	// shortest is the length in bytes of the shortest shingle: a shorter
	// value holds none.
	shortest int
}

func newShingleSet(sample []erasure.TextSample) shingleSet {
	var set shingleSet
	for i, ps := range sample {
		sh := shingles(string(ps))
		if len(sh) < 2 {
			continue
		}
		need := max(2, int32(math.Ceil(copyShare*float64(len(sh)))))
		for _, s := range sh {
			set.shingles = append(set.shingles, s)
			set.passage = append(set.passage, int32(i))
			set.need = append(set.need, need)
			if set.shortest == 0 || len(s) < set.shortest {
				set.shortest = len(s)
			}
		}
	}
	return set
}

// textCopiesSQL counts the passages with a copy in c, on the rows meeting
// where ("" for every row): a value holding at least need of the passage's
// shingles ($1 shingles, $2 their passage, $3 need; $4 the shortest
// shingle's length). Appending the empty string detoasts each value once
// (strpos on the column would fetch and decompress a long value again for
// every shingle), OFFSET 0 keeps that subquery apart, and COLLATE "C" lets
// strpos run on a column of a nondeterministic collation.
func textCopiesSQL(c QColumn, where string) string {
	if where != "" {
		where = ` AND ` + where
	}
	return `SELECT count(DISTINCT h.p) FROM (SELECT ` + c.Ident() + `::text || '' AS v FROM ` + c.Table.Ident() +
		` WHERE ` + c.Ident() + ` IS NOT NULL` + where + ` OFFSET 0) r
		CROSS JOIN LATERAL (SELECT s.p FROM unnest($1::text[], $2::int[], $3::int[]) s(shingle, p, need)
			WHERE strpos(r.v COLLATE "C", s.shingle) > 0 GROUP BY s.p HAVING count(*) >= min(s.need)) h
		WHERE octet_length(r.v) >= $4`
}

// ProbeTextResidue looks for verbatim copies of the sampled passages in
// every text column outside the cascade (every schema) that the manager's
// role may read, but those of the tables and schemas the store excludes,
// and reports per column how many passages have a copy there. Columns on
// sessions and the tables cascading from it are skipped: the same text in
// another session is that session's own data; so is, as for the vector
// probe, another tenant's entry of the same content in a content index
// that records tenants. Nothing of the text leaves this function but
// counts.
func (e *Eraser) ProbeTextResidue(ctx context.Context, sample []erasure.TextSample) (erasure.TextProbe, error) {
	var out erasure.TextProbe
	set := newShingleSet(sample)
	if len(set.shingles) == 0 {
		return out, nil
	}
	l, err := e.layout(ctx, e.Pool)
	if err != nil {
		return out, err
	}
	cols, err := textColumns(ctx, e.Pool)
	if err != nil {
		return out, err
	}
	cascade, rows := l.inCascade(), probedContentRows(l)
	for _, c := range cols {
		switch {
		case cascade[c.col.Table]:
			continue
		case e.excluded(c.col.Table):
			out.Excluded++
			continue
		case !c.canRead:
			out.Unreadable++
			continue
		}
		out.Columns++
		var found int64
		if err := e.Pool.QueryRow(ctx, textCopiesSQL(c.col, rows[c.col.Table]), set.shingles, set.passage, set.need, set.shortest).Scan(&found); err != nil {
			return out, fmt.Errorf("probe %s for text: %w", c.col, err)
		}
		if found > 0 {
			out.Residue = append(out.Residue, erasure.Residue{Column: c.col.String(), Found: found})
		}
	}
	return out, nil
}

// excluded reports whether the store excludes t from the residue probes
// (by its schema or its schema-qualified name).
func (e *Eraser) excluded(t Table) bool {
	for _, x := range e.ProbeExclude {
		if x == t.Schema || x == t.String() {
			return true
		}
	}
	return false
}
