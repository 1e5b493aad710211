package postgres_test

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// serverClock reads the time PostgreSQL's planner and executor spent on the
// top-level statements of every session of one database
// (pg_stat_statements, which the test server preloads with tracking off).
// Round trips, the client, parsing, binding and the commit's work and wait
// are not in it: a ratio of these times says how much of a ratio of wall
// times the statements themselves account for, and which statements.
//
// It reads differences between two snapshots rather than resetting the
// statistics: a reset before each timed deletion would have every statement
// in it create its entry again (a lock and a write of its text), a cost on
// the way with more statements.
type serverClock struct {
	tb   testing.TB
	conn *pgx.Conn
}

// trackServerTime turns statement tracking (planning included) on for the
// database of dsn, for sessions that start afterwards: call it before the
// bench opens its connections. Tracking costs each statement a few
// microseconds, on either way.
func trackServerTime(tb testing.TB, dsn string) {
	tb.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	var db string
	if err := c.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		tb.Fatal(err)
	}
	// Not mustExecTB: a failure here needs the hint.
	for _, sql := range []string{
		`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`,
		`ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` SET pg_stat_statements.track = 'top'`,
		`ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` SET pg_stat_statements.track_planning = on`,
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			tb.Fatalf("%s: %v (the test server preloads pg_stat_statements: see testenv.Postgres.StartServer)", sql, err)
		}
	}
}

// statementStats is one statement's totals so far.
type statementStats struct {
	query      string
	calls      int64
	plan, exec time.Duration
}

// snapshot reads the totals of every statement of the clock's database but
// its own reads, by statement.
func (c serverClock) snapshot() map[string]statementStats {
	c.tb.Helper()
	rows, err := c.conn.Query(context.Background(), `SELECT queryid::text || '/' || userid::text, query, calls, total_plan_time, total_exec_time
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%'`)
	if err != nil {
		c.tb.Fatal(err)
	}
	out := map[string]statementStats{}
	var key string
	var s statementStats
	var planMS, execMS float64
	_, err = pgx.ForEachRow(rows, []any{&key, &s.query, &s.calls, &planMS, &execMS}, func() error {
		s.plan, s.exec = fromMS(planMS), fromMS(execMS)
		out[key] = s
		return nil
	})
	if err != nil {
		c.tb.Fatal(err)
	}
	return out
}

func fromMS(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// cascadeStatement matches the session delete that cascades, raw or
// Lethe's, as pg_stat_statements normalizes it.
var cascadeStatement = regexp.MustCompile(`^DELETE FROM "?memory"?\."?sessions"? WHERE id = `)

// measure runs fn and returns what the server spent on the statements run
// meanwhile. A measure that saw no cascade fails the bench: tracking is off
// in the sessions it should see, or the cascade's statement changed form.
func (c serverClock) measure(fn func()) serverTime {
	c.tb.Helper()
	before := c.snapshot()
	fn()
	var st serverTime
	for key, after := range c.snapshot() {
		d := after
		if b, ok := before[key]; ok {
			d.calls, d.plan, d.exec = after.calls-b.calls, after.plan-b.plan, after.exec-b.exec
		}
		if d.calls == 0 {
			continue
		}
		st.calls += d.calls
		st.plan += d.plan
		st.exec += d.exec
		if cascadeStatement.MatchString(d.query) {
			st.cascade += d.plan + d.exec
		}
		st.statements = append(st.statements, d)
	}
	if st.cascade == 0 {
		c.tb.Fatalf("pg_stat_statements saw no cascade (%s) among %d statements: tracking is off in the bench's sessions (trackServerTime before connecting), or the statement changed form", cascadeStatement, st.calls)
	}
	slices.SortFunc(st.statements, func(a, b statementStats) int { return cmp.Compare(b.plan+b.exec, a.plan+a.exec) })
	return st
}

// serverTime is what the server spent on some statements: planning and
// execution, of that the cascade's, and each statement's.
type serverTime struct {
	plan, exec, cascade time.Duration
	calls               int64
	statements          []statementStats // the most time first
}

func (s serverTime) total() time.Duration { return s.plan + s.exec }

// add sums two measures' times (not their statements).
func (s serverTime) add(o serverTime) serverTime {
	return serverTime{plan: s.plan + o.plan, exec: s.exec + o.exec, cascade: s.cascade + o.cascade, calls: s.calls + o.calls}
}

// top describes the n statements the most time went to: calls, planning
// and execution time, and the statement's first words. Lethe sends every
// value as a parameter, so its statements' texts hold placeholders; a
// utility statement's literals are kept (Lethe's DO block holds none).
func (s serverTime) top(n int) []string {
	var out []string
	for _, st := range s.statements[:min(n, len(s.statements))] {
		q := []rune(whitespace.ReplaceAllString(st.query, " "))
		out = append(out, fmt.Sprintf("%d calls, planning %.1f ms, execution %.1f ms: %s", st.calls, ms(st.plan), ms(st.exec), string(q[:min(90, len(q))])))
	}
	return out
}

var whitespace = regexp.MustCompile(`\s+`)
