package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// ExpectedTables are the tables the decision record (ADR-043, validation
// query 3) expects in the memory schema.
var ExpectedTables = []string{
	"sessions", "rounds", "facts", "fact_corrections", "artifacts", "file_snapshots", "backfill_progress",
}

// Catalog is what the audit reads from the database: the facts the
// decision record's validation queries look at, for one schema.
type Catalog struct {
	// Schema audited.
	Schema string
	// Tables of the schema (names only).
	Tables []string
	// SessionsExists is false when <schema>.sessions is missing.
	SessionsExists bool
	// SessionIDTables are qualified tables of the schema with a session_id column.
	SessionIDTables []string
	// DirectCascade are qualified tables whose session_id column has an
	// ON DELETE CASCADE foreign key to <schema>.sessions(id).
	DirectCascade []string
	// CascadeEdges are ON DELETE CASCADE foreign keys, child -> parent, between qualified tables.
	CascadeEdges [][2]string
	// VectorColumns are pgvector columns of the schema.
	VectorColumns []Column
}

// Column is a qualified table and one of its columns.
type Column struct {
	Table  string
	Column string
}

func (c Column) String() string { return c.Table + "." + c.Column }

// Violation is one finding of the audit. Rule is one of the lethev1.Rule* names.
type Violation struct {
	Rule    string
	Table   string
	Column  string
	Message string
}

// SchemaReport is the audit's result.
type SchemaReport struct {
	// CascadingTables are the qualified tables removed when a session is
	// deleted: reachable from sessions through ON DELETE CASCADE keys.
	CascadingTables []string
	// VectorColumns of the schema, as table.column.
	VectorColumns []string
	Violations    []Violation
}

// Compliant reports whether the audit found nothing wrong.
func (r SchemaReport) Compliant() bool { return len(r.Violations) == 0 }

// AuditCatalog runs the decision record's three validation rules over a
// catalog. It is pure: the same catalog always gives the same report.
//
//  1. every table with a session_id column has an ON DELETE CASCADE foreign key to sessions;
//  2. every vector column lives on a table that a session's deletion removes rows from;
//  3. the expected tables exist in the schema.
func AuditCatalog(cat Catalog) SchemaReport {
	sessions := cat.Schema + ".sessions"
	var rep SchemaReport

	// Tables reachable from sessions by cascading keys (breadth-first).
	reach := map[string]bool{}
	if cat.SessionsExists {
		reach[sessions] = true
		for changed := true; changed; {
			changed = false
			for _, e := range cat.CascadeEdges {
				if reach[e[1]] && !reach[e[0]] {
					reach[e[0]] = true
					changed = true
				}
			}
		}
	}
	for t := range reach {
		if t != sessions {
			rep.CascadingTables = append(rep.CascadingTables, t)
		}
	}
	slices.Sort(rep.CascadingTables)

	for _, name := range ExpectedTables {
		if !slices.Contains(cat.Tables, name) {
			rep.Violations = append(rep.Violations, Violation{
				Rule: lethev1.RuleMissingTable, Table: cat.Schema + "." + name,
				Message: fmt.Sprintf("table %s.%s is missing from the memory schema", cat.Schema, name),
			})
		}
	}

	sidTables := slices.Clone(cat.SessionIDTables)
	slices.Sort(sidTables)
	for _, t := range slices.Compact(sidTables) {
		if t == sessions || slices.Contains(cat.DirectCascade, t) {
			continue
		}
		rep.Violations = append(rep.Violations, Violation{
			Rule: lethev1.RuleNoCascade, Table: t, Column: "session_id",
			Message: fmt.Sprintf("%s.session_id has no ON DELETE CASCADE foreign key to %s(id): deleting a session leaves its rows behind", t, sessions),
		})
	}

	vecs := slices.Clone(cat.VectorColumns)
	slices.SortFunc(vecs, func(a, b Column) int { return strings.Compare(a.String(), b.String()) })
	for _, v := range vecs {
		rep.VectorColumns = append(rep.VectorColumns, v.String())
		if !reach[v.Table] {
			rep.Violations = append(rep.Violations, Violation{
				Rule: lethev1.RuleVectorOffCascade, Table: v.Table, Column: v.Column,
				Message: fmt.Sprintf("vector column %s is on a table that does not cascade from %s: erased embeddings would survive", v, sessions),
			})
		}
	}
	return rep
}

// Querier is the part of pgx that the audit needs (a pool, a conn or a tx).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadCatalog reads the audit's facts for schema from the database catalog.
func ReadCatalog(ctx context.Context, q Querier, schema string) (Catalog, error) {
	cat := Catalog{Schema: schema}
	var err error

	// Validation query 3: the tables of the schema.
	if cat.Tables, err = collect[string](ctx, q, `
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY 1`, schema); err != nil {
		return cat, fmt.Errorf("list tables of schema %q: %w", schema, err)
	}
	cat.SessionsExists = slices.Contains(cat.Tables, "sessions")

	// Every table of the schema with a session_id column (views excluded).
	if cat.SessionIDTables, err = collect[string](ctx, q, `
		SELECT n.nspname || '.' || c.relname
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE a.attname = 'session_id' AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
		  AND n.nspname = $1 ORDER BY 1`, schema); err != nil {
		return cat, fmt.Errorf("list session_id columns: %w", err)
	}

	if cat.SessionsExists {
		// Validation query 1, narrowed to keys on the session_id column.
		if cat.DirectCascade, err = collect[string](ctx, q, `
			SELECT DISTINCT n.nspname || '.' || c.relname
			FROM pg_constraint k
			JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
			JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace
			JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)
			WHERE k.contype = 'f' AND k.confdeltype = 'c'
			  AND pn.nspname = $1 AND p.relname = 'sessions' AND a.attname = 'session_id'
			ORDER BY 1`, schema); err != nil {
			return cat, fmt.Errorf("list cascading keys to sessions: %w", err)
		}
	}

	rows, err := q.Query(ctx, `
		SELECT n.nspname || '.' || c.relname, pn.nspname || '.' || p.relname
		FROM pg_constraint k
		JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace
		WHERE k.contype = 'f' AND k.confdeltype = 'c'
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		return cat, fmt.Errorf("list cascading keys: %w", err)
	}
	var child, parent string
	if _, err := pgx.ForEachRow(rows, []any{&child, &parent}, func() error {
		cat.CascadeEdges = append(cat.CascadeEdges, [2]string{child, parent})
		return nil
	}); err != nil {
		return cat, fmt.Errorf("list cascading keys: %w", err)
	}

	// Validation query 2: the vector columns of the schema (from pg_attribute,
	// which answers what information_schema.columns does, much faster).
	rows, err = q.Query(ctx, `
		SELECT n.nspname || '.' || c.relname, a.attname
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_type t ON t.oid = a.atttypid
		WHERE t.typname = 'vector' AND n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT a.attisdropped
		ORDER BY 1, 2`, schema)
	if err != nil {
		return cat, fmt.Errorf("list vector columns: %w", err)
	}
	var col Column
	if _, err := pgx.ForEachRow(rows, []any{&col.Table, &col.Column}, func() error {
		cat.VectorColumns = append(cat.VectorColumns, col)
		return nil
	}); err != nil {
		return cat, fmt.Errorf("list vector columns: %w", err)
	}
	return cat, nil
}

// AuditSchema reads the catalog of schema and audits it.
func AuditSchema(ctx context.Context, q Querier, schema string) (SchemaReport, error) {
	cat, err := ReadCatalog(ctx, q, schema)
	if err != nil {
		return SchemaReport{}, err
	}
	return AuditCatalog(cat), nil
}

func collect[T any](ctx context.Context, q Querier, sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[T])
}
