package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// After a deletion the manager sends the database, as bind parameters,
// samples of what it erased: text passages and embeddings for the residue
// probes, content hashes for the verification. PostgreSQL writes a logged
// statement's parameters into its server log unless
// log_parameter_max_length is 0 (log_parameter_max_length_on_error for a
// failed statement), and Lethe cannot erase that log. The audit reads
// them as they are in the manager's own sessions (the server's, the
// database's, the role's or the connection's setting, whichever applies).
// The manager sets log_parameter_max_length_on_error and the debug_print_*
// settings itself (Connect); log_parameter_max_length only a superuser (or,
// on PostgreSQL 15 and later, a role granted SET on it) may change, so the
// store's condition says how.

// ParameterLogging is how the server logs the bind parameters of one
// session's statements.
type ParameterLogging struct {
	// Role is the role the session logged in as (session_user: the one its
	// role settings come from, whatever SET ROLE made current), Database
	// the session's database.
	Role, Database string
	// MaxLength and MaxLengthOnError are log_parameter_max_length and
	// log_parameter_max_length_on_error in bytes: -1 every byte, 0 none.
	MaxLength, MaxLengthOnError int64
	// MaxLengthSource is where MaxLength comes from (pg_settings.source:
	// "database user", "user", "client", "configuration file", "default").
	MaxLengthSource string
	// LoggingNow names the settings that have the server log statements
	// now ("log_min_duration_statement = 0"); the parameters of those
	// statements reach the log unless MaxLength is 0.
	LoggingNow []string
	// ValuesLoggedBy names the settings that write a statement's values
	// into the log whatever MaxLength is: auto_explain's plans (Lethe's
	// statements are planned with their values), pgaudit's parameters, the
	// debug_print_* trees.
	ValuesLoggedBy []string
}

// Unlogged reports whether no statement parameter of the role reaches the
// server log, whatever statement logging is turned on later.
func (p ParameterLogging) Unlogged() bool {
	return p.MaxLength == 0 && p.MaxLengthOnError == 0 && len(p.ValuesLoggedBy) == 0
}

// Same reports whether p and q read the same settings.
func (p ParameterLogging) Same(q ParameterLogging) bool {
	return p.Role == q.Role && p.Database == q.Database && p.MaxLength == q.MaxLength && p.MaxLengthOnError == q.MaxLengthOnError &&
		p.MaxLengthSource == q.MaxLengthSource && slices.Equal(p.LoggingNow, q.LoggingNow) && slices.Equal(p.ValuesLoggedBy, q.ValuesLoggedBy)
}

// Fix says what keeps the role's parameters out of the server log, for
// the setting where it comes from: a role-in-database setting beats a
// role setting, and a connection option beats both.
func (p ParameterLogging) Fix() string {
	var fixes []string
	role := pgx.Identifier{p.Role}.Sanitize()
	switch {
	case p.MaxLength == 0:
	case p.MaxLengthSource == "client":
		fixes = append(fixes, "remove log_parameter_max_length from the options of the store's DSN")
	case p.MaxLengthSource == "database user":
		fixes = append(fixes, fmt.Sprintf("as a superuser, ALTER ROLE %s IN DATABASE %s SET log_parameter_max_length = 0", role, pgx.Identifier{p.Database}.Sanitize()))
	default:
		fixes = append(fixes, fmt.Sprintf("as a superuser, ALTER ROLE %s SET log_parameter_max_length = 0", role))
	}
	if p.MaxLengthOnError != 0 {
		fixes = append(fixes, "let the manager's log_parameter_max_length_on_error = 0 reach the server (a connection pooler that drops startup parameters does not)")
	}
	for _, s := range p.ValuesLoggedBy {
		fixes = append(fixes, fmt.Sprintf("turn off %s for role %s", s, role))
	}
	return strings.Join(fixes, "; ")
}

// parameterLoggingSQL reads the settings in base units (pg_settings.setting:
// bytes, milliseconds), as the current session has them. Statement
// logging counts when it covers statements Lethe sends samples with
// (log_statement mod: its DELETEs; all), by duration, or by sampling.
// pg_settings builds a row for every setting the server knows each time it
// is read, so it is read once (s) and each setting taken from that. Each
// CASE arm casts only its own setting. (A server older than 13, which has
// neither length setting, refuses the manager's connections: Connect.)
const parameterLoggingSQL = `WITH s AS MATERIALIZED (SELECT name, setting, source FROM pg_settings)
SELECT session_user::text, current_database()::text,
	(SELECT setting::bigint FROM s WHERE name = 'log_parameter_max_length'),
	(SELECT setting::bigint FROM s WHERE name = 'log_parameter_max_length_on_error'),
	(SELECT source FROM s WHERE name = 'log_parameter_max_length'),
	ARRAY(SELECT name || ' = ' || setting FROM s WHERE CASE name
		WHEN 'log_statement' THEN setting IN ('mod', 'all')
		WHEN 'log_min_duration_statement' THEN setting::bigint >= 0
		WHEN 'log_min_duration_sample' THEN setting::bigint >= 0 AND current_setting('log_statement_sample_rate', true)::float8 > 0
		WHEN 'log_transaction_sample_rate' THEN setting::float8 > 0
		ELSE false END ORDER BY name),
	ARRAY(SELECT name || ' = ' || setting FROM s WHERE CASE name
		WHEN 'auto_explain.log_min_duration' THEN setting::bigint >= 0
		WHEN 'pgaudit.log_parameter' THEN setting = 'on'
		WHEN 'debug_print_parse' THEN setting = 'on'
		WHEN 'debug_print_rewritten' THEN setting = 'on'
		WHEN 'debug_print_plan' THEN setting = 'on'
		ELSE false END ORDER BY name)`

// AuditParameterLogging reads how the server logs the statement
// parameters of q's session.
func AuditParameterLogging(ctx context.Context, q Querier) (ParameterLogging, error) {
	var p ParameterLogging
	err := q.QueryRow(ctx, parameterLoggingSQL).Scan(&p.Role, &p.Database, &p.MaxLength, &p.MaxLengthOnError, &p.MaxLengthSource, &p.LoggingNow, &p.ValuesLoggedBy)
	if err != nil {
		return p, fmt.Errorf("read the server's parameter logging settings: %w", err)
	}
	return p, nil
}
