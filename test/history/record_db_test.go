package history

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
)

// installRecorder adds row triggers that copy every committed change of the
// tables an erasure touches into history.effects, in the same transaction:
// a rolled-back statement leaves no effect, a committed one cannot be
// missed. Content columns are left out; IDs, tenants, tombstones, ledger
// and receipt rows are kept. The function runs as its owner (the
// superuser), so the manager's role needs no grant on the history schema.
func installRecorder(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, `
CREATE SCHEMA history;
CREATE TABLE history.effects (
    seq      bigserial PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    txid     bigint      NOT NULL DEFAULT txid_current(),
    tbl      text        NOT NULL,
    op       text        NOT NULL,
    old_row  jsonb,
    new_row  jsonb
);
CREATE FUNCTION history.record() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    strip text[] := ARRAY['summary', 'summary_embedding', 'text', 'embedding', 'counts'];
BEGIN
    INSERT INTO history.effects (tbl, op, old_row, new_row) VALUES (
        TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, TG_OP,
        CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) - strip END,
        CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) - strip END);
    RETURN NULL;
END $$;
CREATE TRIGGER history_sessions AFTER INSERT OR UPDATE OR DELETE ON memory.sessions FOR EACH ROW EXECUTE FUNCTION history.record();
CREATE TRIGGER history_ledger AFTER INSERT OR UPDATE OR DELETE ON lethe.erasure_ledger FOR EACH ROW EXECUTE FUNCTION history.record();
CREATE TRIGGER history_receipts AFTER INSERT OR UPDATE OR DELETE ON lethe.erasure_receipts FOR EACH ROW EXECUTE FUNCTION history.record();
CREATE TRIGGER history_profiles AFTER DELETE ON memory_derived.profiles FOR EACH ROW EXECUTE FUNCTION history.record();
CREATE TRIGGER history_derivations AFTER DELETE ON memory_derived.derivations FOR EACH ROW EXECUTE FUNCTION history.record();
CREATE TRIGGER history_cache AFTER DELETE ON memory_derived.embedding_cache FOR EACH ROW EXECUTE FUNCTION history.record();
`)
	return err
}

// dbEffect is one committed row change.
type dbEffect struct {
	Seq   int64
	At    time.Time
	Txid  int64
	Table string
	Op    string
	Old   map[string]any
	New   map[string]any
}

// str reads a text column of a recorded row ("" when absent or null).
func str(row map[string]any, col string) string {
	if row == nil {
		return ""
	}
	s, _ := row[col].(string)
	return s
}

// timeOf reads a timestamptz column of a recorded row.
func timeOf(row map[string]any, col string) (time.Time, bool) {
	s := str(row, col)
	if s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse("2006-01-02T15:04:05.999999Z07:00", s)
	return t, err == nil
}

// effectsSince reads the effects recorded after seq.
func effectsSince(ctx context.Context, conn *pgx.Conn, seq int64) ([]dbEffect, error) {
	rows, err := conn.Query(ctx, `SELECT seq, at, txid, tbl, op, old_row, new_row FROM history.effects WHERE seq > $1 ORDER BY seq`, seq)
	if err != nil {
		return nil, err
	}
	return collectEffects(rows)
}

// effectsAfter reads the effects recorded after the moment at (database
// clock). A restore takes the effects table back to the dump's, whose rows
// are all older than the restore, and its sequence with it: what comes
// after the restore is told by its time, not by its sequence number.
func effectsAfter(ctx context.Context, conn *pgx.Conn, at time.Time) ([]dbEffect, error) {
	rows, err := conn.Query(ctx, `SELECT seq, at, txid, tbl, op, old_row, new_row FROM history.effects WHERE at > $1 ORDER BY seq`, at)
	if err != nil {
		return nil, err
	}
	return collectEffects(rows)
}

func collectEffects(rows pgx.Rows) ([]dbEffect, error) {
	var out []dbEffect
	var e dbEffect
	var oldRaw, newRaw []byte
	_, err := pgx.ForEachRow(rows, []any{&e.Seq, &e.At, &e.Txid, &e.Table, &e.Op, &oldRaw, &newRaw}, func() error {
		e.Old, e.New = nil, nil
		if oldRaw != nil {
			if err := json.Unmarshal(oldRaw, &e.Old); err != nil {
				return err
			}
		}
		if newRaw != nil {
			if err := json.Unmarshal(newRaw, &e.New); err != nil {
				return err
			}
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// lastEffect is the sequence number of the latest recorded effect.
func lastEffect(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var seq int64
	err := conn.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM history.effects`).Scan(&seq)
	return seq, err
}
