package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// After a deletion the manager sends the database, as bind parameters,
// samples of what it erased: text passages and embeddings for the residue
// probes, content hashes for the verification. PostgreSQL writes a logged
// statement's parameters into its server log unless
// log_parameter_max_length is 0 (log_parameter_max_length_on_error for a
// failed statement), and Lethe cannot erase that log. The audit reads
// both as they are in the manager's own sessions (the server's, the
// database's or the role's setting, whichever applies); only a superuser
// (or a role granted SET on them) may change them, so the store's
// condition says how.

// ParameterLogging is how the server logs the bind parameters of the
// current role's statements.
type ParameterLogging struct {
	// Role is the role the statements run as (current_user).
	Role string
	// MaxLength and MaxLengthOnError are log_parameter_max_length and
	// log_parameter_max_length_on_error in bytes: -1 every byte, 0 none.
	MaxLength, MaxLengthOnError int64
	// LoggingNow names the settings that have the server log statements
	// now ("log_min_duration_statement = 0"); the parameters of those
	// statements reach the log unless MaxLength is 0.
	LoggingNow []string
}

// Unlogged reports whether no statement parameter of the role reaches the
// server log, whatever statement logging is turned on later.
func (p ParameterLogging) Unlogged() bool { return p.MaxLength == 0 && p.MaxLengthOnError == 0 }

// Fix is the statement a superuser runs to keep the role's parameters out
// of the server log.
func (p ParameterLogging) Fix() string {
	role := pgx.Identifier{p.Role}.Sanitize()
	return fmt.Sprintf("ALTER ROLE %s SET log_parameter_max_length = 0; ALTER ROLE %s SET log_parameter_max_length_on_error = 0", role, role)
}

// parameterLoggingSQL reads the settings in base units (pg_settings.setting:
// bytes, milliseconds), as the current session has them. Statement
// logging counts when it covers the statements Lethe sends parameters with
// (log_statement mod or all: DELETE and SELECT), by duration, or by
// sampling. A server older than 13 logs them whole, with no setting to stop
// it: -1.
const parameterLoggingSQL = `SELECT current_user::text,
	coalesce((SELECT setting::bigint FROM pg_settings WHERE name = 'log_parameter_max_length'), -1),
	coalesce((SELECT setting::bigint FROM pg_settings WHERE name = 'log_parameter_max_length_on_error'), -1),
	ARRAY(SELECT name || ' = ' || setting FROM pg_settings WHERE
		name = 'log_statement' AND setting IN ('mod', 'all')
		OR name IN ('log_min_duration_statement', 'log_min_duration_sample') AND setting::bigint >= 0
		OR name = 'log_transaction_sample_rate' AND setting::float8 > 0
		ORDER BY name)`

// AuditParameterLogging reads how the server logs the current role's
// statement parameters.
func AuditParameterLogging(ctx context.Context, q Querier) (ParameterLogging, error) {
	var p ParameterLogging
	err := q.QueryRow(ctx, parameterLoggingSQL).Scan(&p.Role, &p.MaxLength, &p.MaxLengthOnError, &p.LoggingNow)
	if err != nil {
		return p, fmt.Errorf("read the server's parameter logging settings: %w", err)
	}
	return p, nil
}

// AuditPoolParameterLogging reads how the server logs the parameters of
// the pool's sessions. A setting given to a role or a database applies only
// to sessions that start after it; so when the pool's session logs them, a
// new session is asked too, and if it would not, the pool is reset: its
// connections are replaced by ones with the setting (those in use close
// when released), and the new session's reading is returned.
func AuditPoolParameterLogging(ctx context.Context, pool *pgxpool.Pool) (ParameterLogging, error) {
	p, err := AuditParameterLogging(ctx, pool)
	if err != nil || p.Unlogged() {
		return p, err
	}
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return p, fmt.Errorf("open a new session to read its logging settings: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	fresh, err := AuditParameterLogging(ctx, conn)
	if err != nil {
		return p, err
	}
	if fresh.Unlogged() {
		pool.Reset()
	}
	return fresh, nil
}
