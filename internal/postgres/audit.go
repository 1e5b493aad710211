package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
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
	// NonCascadingKeys are the foreign keys to <schema>.sessions or to a
	// table with a cascading key of its own that do not cascade on delete.
	NonCascadingKeys []ForeignKey
	// RowSecurity of every qualified table that has any; a table missing
	// here has row-level security off and no policy.
	RowSecurity map[string]RowSecurity
	// RegistryMissing is true when Lethe's registry tables do not exist.
	RegistryMissing bool
	// ContentIndexes are the qualified tables registered in lethe.content_indexes.
	ContentIndexes []string
	// Lineages are the tables registered in lethe.lineage_tables, with their triggers.
	Lineages []GuardedLineage
	// Sources are the columns registered in lethe.source_columns, with their triggers.
	Sources []GuardedSource
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

// AuditCatalog runs the erasure rules over a catalog. It is pure: the same
// catalog always gives the same report. The decision record's three
// validation rules:
//
//  1. every table with a session_id column has an ON DELETE CASCADE foreign key to sessions;
//  2. every vector column lives on a table that a session's deletion removes rows from;
//  3. the expected tables exist in the schema;
//
// and what makes them hold for every reader and every derivation:
//
//  4. every foreign key (any schema, any column) to sessions or to a table
//     cascading from it cascades on delete;
//  5. sessions, the tables cascading from it, the registered derived tables
//     and content indexes have row-level security on, forced, with a policy;
//  6. every registered lineage table has its guard trigger, every derived
//     table its lineage requirement, every registered source column its
//     refusal trigger;
//  7. the registries of content indexes and lineage tables are not empty.
func AuditCatalog(cat Catalog) SchemaReport {
	reach := cascadeReach(cat)
	var rep SchemaReport
	sessions := cat.Schema + ".sessions"
	for t := range reach {
		if t != sessions {
			rep.CascadingTables = append(rep.CascadingTables, t)
		}
	}
	slices.Sort(rep.CascadingTables)
	rep.Violations = append(rep.Violations, missingTables(cat)...)
	noCascade := uncascaded(cat)
	rep.Violations = append(rep.Violations, noCascade...)
	var offCascade []Violation
	rep.VectorColumns, offCascade = vectorsOffCascade(cat, reach)
	rep.Violations = append(rep.Violations, offCascade...)
	rep.Violations = append(rep.Violations, nonCascadingKeys(cat, reach, noCascade)...)
	rep.Violations = append(rep.Violations, rowSecurityOff(cat, reach)...)
	rep.Violations = append(rep.Violations, lineageUnguarded(cat)...)
	rep.Violations = append(rep.Violations, sourcesUnguarded(cat)...)
	rep.Violations = append(rep.Violations, emptyRegistries(cat)...)
	return rep
}

// cascadeReach are the qualified tables reachable from sessions by
// cascading keys, sessions included (none when it is missing).
func cascadeReach(cat Catalog) map[string]bool {
	reach := map[string]bool{}
	if !cat.SessionsExists {
		return reach
	}
	reach[cat.Schema+".sessions"] = true
	for changed := true; changed; {
		changed = false
		for _, e := range cat.CascadeEdges {
			if reach[e[1]] && !reach[e[0]] {
				reach[e[0]] = true
				changed = true
			}
		}
	}
	return reach
}

// missingTables is rule 3.
func missingTables(cat Catalog) []Violation {
	var out []Violation
	for _, name := range ExpectedTables {
		if !slices.Contains(cat.Tables, name) {
			out = append(out, Violation{
				Rule: lethev1.RuleMissingTable, Table: cat.Schema + "." + name,
				Message: fmt.Sprintf("table %s.%s is missing from the memory schema", cat.Schema, name),
			})
		}
	}
	return out
}

// uncascaded is rule 1.
func uncascaded(cat Catalog) []Violation {
	sessions := cat.Schema + ".sessions"
	sidTables := slices.Clone(cat.SessionIDTables)
	slices.Sort(sidTables)
	var out []Violation
	for _, t := range slices.Compact(sidTables) {
		if t == sessions || slices.Contains(cat.DirectCascade, t) {
			continue
		}
		out = append(out, Violation{
			Rule: lethev1.RuleNoCascade, Table: t, Column: "session_id",
			Message: fmt.Sprintf("%s.session_id has no ON DELETE CASCADE foreign key to %s(id): deleting a session leaves its rows behind", t, sessions),
		})
	}
	return out
}

// vectorsOffCascade is rule 2; it also returns every vector column, sorted.
func vectorsOffCascade(cat Catalog, reach map[string]bool) ([]string, []Violation) {
	vecs := slices.Clone(cat.VectorColumns)
	slices.SortFunc(vecs, func(a, b Column) int { return strings.Compare(a.String(), b.String()) })
	var names []string
	var out []Violation
	for _, v := range vecs {
		names = append(names, v.String())
		if !reach[v.Table] {
			out = append(out, Violation{
				Rule: lethev1.RuleVectorOffCascade, Table: v.Table, Column: v.Column,
				Message: fmt.Sprintf("vector column %s is on a table that does not cascade from %s.sessions: erased embeddings would survive", v, cat.Schema),
			})
		}
	}
	return names, out
}

const (
	// schemaTablesSQL lists the tables of the schema $1 (validation query 3).
	schemaTablesSQL = `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY 1`
	// sessionIDTablesSQL lists every table of the schema $1 with a
	// session_id column (views excluded).
	sessionIDTablesSQL = `SELECT n.nspname || '.' || c.relname
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE a.attname = 'session_id' AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
		  AND n.nspname = $1 ORDER BY 1`
	// directCascadeSQL lists the tables whose session_id has an ON DELETE
	// CASCADE key to $1.sessions (validation query 1, narrowed to keys on
	// the session_id column).
	directCascadeSQL = `SELECT DISTINCT n.nspname || '.' || c.relname
		FROM pg_constraint k
		JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace
		JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)
		WHERE k.contype = 'f' AND k.confdeltype = 'c'
		  AND pn.nspname = $1 AND p.relname = 'sessions' AND a.attname = 'session_id'
		ORDER BY 1`
	// cascadeEdgesSQL lists every ON DELETE CASCADE key, child -> parent.
	cascadeEdgesSQL = `SELECT n.nspname || '.' || c.relname, pn.nspname || '.' || p.relname
		FROM pg_constraint k
		JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace
		WHERE k.contype = 'f' AND k.confdeltype = 'c'
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema')`
	// schemaVectorColumnsSQL lists the vector columns of the schema $1
	// (validation query 2, from pg_attribute, which answers what
	// information_schema.columns does, much faster).
	schemaVectorColumnsSQL = `SELECT n.nspname || '.' || c.relname, a.attname
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_type t ON t.oid = a.atttypid
		WHERE t.typname = 'vector' AND n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT a.attisdropped
		ORDER BY 1, 2`
)

// ReadCatalog reads the audit's facts for schema from the database catalog
// and Lethe's registry.
func ReadCatalog(ctx context.Context, q Querier, schema string) (Catalog, error) {
	cat := Catalog{Schema: schema}
	var err error
	if cat.Tables, err = collectStrings(ctx, q, schemaTablesSQL, schema); err != nil {
		return cat, fmt.Errorf("list tables of schema %q: %w", schema, err)
	}
	cat.SessionsExists = slices.Contains(cat.Tables, "sessions")
	if cat.SessionIDTables, err = collectStrings(ctx, q, sessionIDTablesSQL, schema); err != nil {
		return cat, fmt.Errorf("list session_id columns: %w", err)
	}
	if cat.SessionsExists {
		if cat.DirectCascade, err = collectStrings(ctx, q, directCascadeSQL, schema); err != nil {
			return cat, fmt.Errorf("list cascading keys to sessions: %w", err)
		}
	}
	if cat.CascadeEdges, err = collectPairs(ctx, q, cascadeEdgesSQL); err != nil {
		return cat, fmt.Errorf("list cascading keys: %w", err)
	}
	vecs, err := collectPairs(ctx, q, schemaVectorColumnsSQL, schema)
	if err != nil {
		return cat, fmt.Errorf("list vector columns: %w", err)
	}
	for _, v := range vecs {
		cat.VectorColumns = append(cat.VectorColumns, Column{Table: v[0], Column: v[1]})
	}
	return cat, readGuards(ctx, q, &cat)
}

// collectPairs runs a query of two text columns and returns its rows.
func collectPairs(ctx context.Context, q Querier, sql string, args ...any) ([][2]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	var out [][2]string
	var p [2]string
	_, err = pgx.ForEachRow(rows, []any{&p[0], &p[1]}, func() error {
		out = append(out, p)
		return nil
	})
	return out, err
}

// AuditSchema reads the catalog of schema and audits it.
func AuditSchema(ctx context.Context, q Querier, schema string) (SchemaReport, error) {
	cat, err := ReadCatalog(ctx, q, schema)
	if err != nil {
		return SchemaReport{}, err
	}
	return AuditCatalog(cat), nil
}

// guardSchema audits the schema as the caller's transaction sees it, by the
// same rules as the store's audit: a deletion that goes ahead on a table
// added since the store's last audit (a session_id without a cascading key)
// would leave that table's rows of the session behind and still report it
// clean; one that goes ahead after a guard was dropped (row-level security,
// a lineage trigger, a registry row) would report an erasure that readers
// or derivations may still undo. It returns a
// *erasure.ConfigError naming the tables when the schema breaks the rules.
func guardSchema(ctx context.Context, q Querier, schema string) error {
	rep, err := AuditSchema(ctx, q, schema)
	if err != nil {
		return fmt.Errorf("audit the schema in the deletion's transaction: %w", err)
	}
	if rep.Compliant() {
		return nil
	}
	where := make([]string, 0, len(rep.Violations))
	for _, v := range rep.Violations {
		w := v.Table
		if v.Column != "" {
			w += "." + v.Column
		}
		where = append(where, w+" ("+v.Rule+")")
	}
	slices.Sort(where)
	return &erasure.ConfigError{Reason: lethev1.ReasonSchemaChanged,
		Message: "the schema the deletion reads breaks the erasure rules: " + strings.Join(slices.Compact(where), ", ") +
			"; nothing more is deleted until it is fixed (the MemoryStore's audit says how)"}
}
