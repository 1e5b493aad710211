package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// serverClock reads the time PostgreSQL itself spent planning and executing
// the top-level statements of every session of one database
// (pg_stat_statements, which the test server preloads with tracking off):
// the work a deletion asks of the server, without round trips, the client
// or waiting for the commit's flush. A ratio of these times is what a ratio
// of wall times would be with those taken away, and it says which
// statements the time went to.
type serverClock struct {
	tb   testing.TB
	conn *pgx.Conn
}

// trackServerTime turns statement tracking (planning included) on for the
// database of dsn, for sessions that start afterwards: call it before the
// bench opens its connections.
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

// statementsNotTheClock leaves out the clock's own statements.
const statementsNotTheClock = `dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%'`

// reset forgets what was spent so far.
func (c serverClock) reset() {
	c.tb.Helper()
	if _, err := c.conn.Exec(context.Background(), `SELECT pg_stat_statements_reset()`); err != nil {
		c.tb.Fatal(err)
	}
}

// cascadeStatement matches the session delete that cascades, raw or
// Lethe's, as pg_stat_statements normalizes it.
const cascadeStatement = `^DELETE FROM "?memory"?\."?sessions"? WHERE id = `

// read returns what the server spent since the last reset. A clock that
// saw no cascade fails the bench: tracking is off in the sessions it should
// see, or the cascade's statement changed form.
func (c serverClock) read() serverTime {
	c.tb.Helper()
	var planMS, execMS, cascadeMS float64
	var st serverTime
	err := c.conn.QueryRow(context.Background(), `SELECT coalesce(sum(total_plan_time), 0), coalesce(sum(total_exec_time), 0),
			coalesce(sum(total_plan_time + total_exec_time) FILTER (WHERE query ~ $1), 0), coalesce(sum(calls), 0)::bigint
		FROM pg_stat_statements WHERE `+statementsNotTheClock, cascadeStatement).Scan(&planMS, &execMS, &cascadeMS, &st.calls)
	if err != nil {
		c.tb.Fatal(err)
	}
	if cascadeMS == 0 {
		c.tb.Fatalf("pg_stat_statements saw no cascade (%s) among %d statements: tracking is off in the bench's sessions (trackServerTime before connecting), or the statement changed form", cascadeStatement, st.calls)
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	st.plan, st.exec, st.cascade = ms(planMS), ms(execMS), ms(cascadeMS)
	return st
}

// measure runs fn alone on the clock and returns its server time.
func (c serverClock) measure(fn func()) serverTime {
	c.reset()
	fn()
	return c.read()
}

// top describes the n statements the server spent the most time on since
// the last reset: calls, planning and execution time, and the statement's
// first words (normalized: its values are placeholders, never in it).
func (c serverClock) top(n int) []string {
	c.tb.Helper()
	rows, err := c.conn.Query(context.Background(), `SELECT format('%s calls, planning %s ms, execution %s ms: %s', calls,
			round(total_plan_time::numeric, 1), round(total_exec_time::numeric, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 90))
		FROM pg_stat_statements WHERE `+statementsNotTheClock+` ORDER BY total_plan_time + total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		c.tb.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.tb.Fatal(err)
	}
	return out
}

// serverTime is what the server spent on some statements: planning and
// execution, and of that the cascade's.
type serverTime struct {
	plan, exec, cascade time.Duration
	calls               int64
}

func (s serverTime) total() time.Duration { return s.plan + s.exec }

func (s serverTime) add(o serverTime) serverTime {
	return serverTime{plan: s.plan + o.plan, exec: s.exec + o.exec, cascade: s.cascade + o.cascade, calls: s.calls + o.calls}
}
