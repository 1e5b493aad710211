package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", firstLine(sql), err)
	}
}

func queryStrings(t *testing.T, conn *pgx.Conn, sql string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func firstLine(s string) string { return strings.SplitN(strings.TrimSpace(s), "\n", 2)[0] }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// seedTwoSessions writes one row of every kind for two sessions (...01 and ...02),
// a profile derived from each, and a cache entry of each one's content.
func seedTwoSessions(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	for i, id := range []string{"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"} {
		sha := []string{"sha-of-erased", "sha-of-live"}[i]
		mustExec(t, conn, `INSERT INTO memory.sessions (id, summary, summary_sha256) VALUES ($1, 'summary', $2)`, id, sha)
		mustExec(t, conn, `INSERT INTO memory.rounds (session_id, round_index, user_text, content_sha256) VALUES ($1, 0, 'hello', $2)`, id, sha)
		mustExec(t, conn, `INSERT INTO memory.facts (session_id, round_id, kind, content)
			SELECT $1, id, 'decision', 'use postgres' FROM memory.rounds WHERE session_id = $1`, id)
		mustExec(t, conn, `INSERT INTO memory.fact_corrections (fact_id, session_id, correction)
			SELECT id, $1, 'use postgres 15' FROM memory.facts WHERE session_id = $1`, id)
		mustExec(t, conn, `INSERT INTO memory.artifacts (session_id, kind, artifact_ref) VALUES ($1, 'commit', 'abc')`, id)
		mustExec(t, conn, `INSERT INTO memory.file_snapshots (session_id, path, content) VALUES ($1, 'a.go', 'package a')`, id)
		mustExec(t, conn, `INSERT INTO memory.backfill_progress (source_path, session_id) VALUES ($1, $2)`, "f"+id, id)
		mustExec(t, conn, `WITH p AS (INSERT INTO memory_derived.profiles (kind, summary) VALUES ('user', 'profile') RETURNING id)
			INSERT INTO memory_derived.derivations (derived_id, source_session_id) SELECT id, $1 FROM p`, id)
		mustExec(t, conn, `INSERT INTO memory_derived.embedding_cache (content_sha256, text, embedding)
			VALUES ($1, 'hello', array_fill(0.1, ARRAY[384])::vector)`, sha)
	}
}
