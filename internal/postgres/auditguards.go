package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// The audit's rules beyond the decision record's three queries: what keeps
// an erased session's rows from outliving it (keys), hides a tombstoned one
// from every reader (row-level security), refuses derivations from it
// (lineage triggers), and tells Lethe what a cascade misses (the registry).

// ForeignKey is a foreign key: Columns of Table reference Parent, and a
// deletion of the parent row does OnDelete.
type ForeignKey struct {
	Table    string
	Columns  string
	Parent   string
	OnDelete string
}

// RowSecurity is a table's row-level security.
type RowSecurity struct {
	Enabled bool
	Forced  bool
	// Policies counts the permissive policies: with none, row-level
	// security lets nobody read (restrictive policies only narrow).
	Policies int
}

// GuardedSource is a registered source column (lethe.source_columns) and
// whether its refusal is in place.
type GuardedSource struct {
	Table  string
	Column string
	// Guarded: enabled row triggers without a WHEN condition run
	// lethe.refuse_erased_source on Column of Table on insert and on
	// update of Column.
	Guarded bool
}

// GuardedLineage is a registered lineage table and its triggers.
type GuardedLineage struct {
	Table        string
	SourceColumn string
	DerivedTable string
	// Guarded: an enabled row trigger on insert runs
	// lethe.refuse_erased_lineage on SourceColumn of Table.
	Guarded bool
	// Required: an enabled row trigger on insert runs lethe.require_lineage
	// on DerivedTable.
	Required bool
}

// Registries named by the EmptyRegistry rule.
const (
	contentIndexRegistry = "lethe.content_indexes"
	lineageRegistry      = "lethe.lineage_tables"
	sourceRegistry       = "lethe.source_columns"
)

// nonCascadingKeys are the foreign keys to sessions or to a table cascading
// from it that do not cascade: a row referencing an erased session outlives
// it (SET NULL, SET DEFAULT) or blocks its deletion (NO ACTION, RESTRICT).
// A column that NoCascade already names is not named twice.
func nonCascadingKeys(cat Catalog, reach map[string]bool, named []Violation) []Violation {
	seen := map[Column]bool{}
	for _, v := range named {
		seen[Column{v.Table, v.Column}] = true
	}
	var out []Violation
	for _, k := range cat.NonCascadingKeys {
		if !reach[k.Parent] || seen[Column{k.Table, k.Columns}] {
			continue
		}
		seen[Column{k.Table, k.Columns}] = true
		out = append(out, Violation{
			Rule: lethev1.RuleNonCascadingKey, Table: k.Table, Column: k.Columns,
			Message: fmt.Sprintf("%s.%s references %s ON DELETE %s: a row of an erased session must go with it (ON DELETE CASCADE)",
				k.Table, k.Columns, k.Parent, k.OnDelete),
		})
	}
	return out
}

// readPaths are the tables that must hide a tombstoned session from every
// reader: sessions, the tables cascading from it, the registered derived
// tables and content indexes. Sorted.
func readPaths(cat Catalog, reach map[string]bool) []string {
	var out []string
	for t := range reach {
		out = append(out, t)
	}
	out = append(out, cat.ContentIndexes...)
	for _, l := range cat.Lineages {
		out = append(out, l.DerivedTable)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// rowSecurityOff names each read path whose row-level security is off, not
// forced (its owner reads tombstoned sessions) or has no permissive policy.
func rowSecurityOff(cat Catalog, reach map[string]bool) []Violation {
	var out []Violation
	for _, t := range readPaths(cat, reach) {
		rs := cat.RowSecurity[t]
		if !rs.Enabled {
			out = append(out, Violation{Rule: lethev1.RuleRowSecurityDisabled, Table: t,
				Message: fmt.Sprintf("%s has row-level security off: a query without the tombstone filter reads tombstoned sessions (ENABLE and FORCE ROW LEVEL SECURITY, with policies as in migration 00003)", t)})
			continue
		}
		if !rs.Forced {
			out = append(out, Violation{Rule: lethev1.RuleRowSecurityNotForced, Table: t,
				Message: fmt.Sprintf("%s does not force row-level security: its owner reads tombstoned sessions (FORCE ROW LEVEL SECURITY, and an owner role no application uses, as in migration 00010)", t)})
		}
		if rs.Policies == 0 {
			out = append(out, Violation{Rule: lethev1.RuleMissingPolicy, Table: t,
				Message: fmt.Sprintf("%s has row-level security on and no permissive policy: neither the application nor Lethe reads its rows (add policies as in migrations 00003 and 00004)", t)})
		}
	}
	return out
}

// lineageUnguarded names each registered lineage table without its guard
// trigger and each derived table without its lineage requirement.
func lineageUnguarded(cat Catalog) []Violation {
	var out []Violation
	for _, l := range cat.Lineages {
		if !l.Guarded {
			out = append(out, Violation{Rule: lethev1.RuleMissingLineageGuard, Table: l.Table, Column: l.SourceColumn,
				Message: fmt.Sprintf("%s has no enabled trigger running lethe.refuse_erased_lineage('%s'): a derivation from an erased session is not refused (as in migration 00003)", l.Table, l.SourceColumn)})
		}
		if !l.Required {
			out = append(out, Violation{Rule: lethev1.RuleMissingLineageRequirement, Table: l.DerivedTable,
				Message: fmt.Sprintf("%s has no enabled trigger running lethe.require_lineage(): a record without lineage escapes the guard and the deletion (as in migration 00008)", l.DerivedTable)})
		}
	}
	return out
}

// sourcesUnguarded names each registered source column without its
// refusal trigger.
func sourcesUnguarded(cat Catalog) []Violation {
	var out []Violation
	for _, src := range cat.Sources {
		if !src.Guarded {
			out = append(out, Violation{Rule: lethev1.RuleMissingSourceGuard, Table: src.Table, Column: src.Column,
				Message: fmt.Sprintf("%s has no enabled trigger running lethe.refuse_erased_source('%s') on insert and on update of it: re-ingesting an erased transcript is not refused (as in migration 00006)", src.Table, src.Column)})
		}
	}
	return out
}

// emptyRegistries names the registry that lists nothing: Lethe cleans only
// the content-keyed and derived tables registered there.
func emptyRegistries(cat Catalog) []Violation {
	why := "has no row"
	if cat.RegistryMissing {
		why = "does not exist (apply migration 00002)"
	}
	var out []Violation
	if len(cat.ContentIndexes) == 0 {
		out = append(out, Violation{Rule: lethev1.RuleEmptyRegistry, Table: contentIndexRegistry,
			Message: contentIndexRegistry + " " + why + ": Lethe deletes no content-keyed entry (an embedding cache) of erased content; register each content-keyed table"})
	}
	if len(cat.Lineages) == 0 {
		out = append(out, Violation{Rule: lethev1.RuleEmptyRegistry, Table: lineageRegistry,
			Message: lineageRegistry + " " + why + ": Lethe deletes no record derived from erased sessions; register each lineage table"})
	}
	return out
}

const (
	// nonCascadingKeysSQL lists the foreign keys that do not cascade on
	// delete to $1.sessions or to a table that cascades from another (the
	// audit keeps those whose parent a session's deletion reaches). A
	// partition's copy of its parent's key is left out.
	nonCascadingKeysSQL = `SELECT n.nspname || '.' || c.relname,
			(SELECT string_agg(a.attname, ',' ORDER BY array_position(k.conkey, a.attnum))
			 FROM pg_attribute a WHERE a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)),
			pn.nspname || '.' || p.relname,
			CASE k.confdeltype WHEN 'a' THEN 'NO ACTION' WHEN 'r' THEN 'RESTRICT' WHEN 'n' THEN 'SET NULL' ELSE 'SET DEFAULT' END
		FROM pg_constraint k
		JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_class p ON p.oid = k.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace
		WHERE k.contype = 'f' AND k.confdeltype <> 'c' AND k.conparentid = 0
		  AND (pn.nspname = $1 AND p.relname = 'sessions'
		       OR k.confrelid IN (SELECT conrelid FROM pg_constraint WHERE contype = 'f' AND confdeltype = 'c'))
		ORDER BY 1, 2, 3`
	// rowSecuritySQL lists every table with any row-level security (on,
	// forced or a policy), with its count of permissive policies.
	rowSecuritySQL = `SELECT n.nspname || '.' || c.relname, c.relrowsecurity, c.relforcerowsecurity,
			(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid AND p.polpermissive)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p')
		  AND (c.relrowsecurity OR c.relforcerowsecurity OR EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid))`
	// registryExistsSQL: are Lethe's registry tables there (migration 00002)?
	registryExistsSQL = `SELECT to_regclass('lethe.content_indexes') IS NOT NULL AND to_regclass('lethe.lineage_tables') IS NOT NULL,
		to_regclass('lethe.source_columns') IS NOT NULL`
	// contentIndexTablesSQL lists the registered content-keyed tables.
	contentIndexTablesSQL = `SELECT n.nspname || '.' || c.relname
		FROM lethe.content_indexes i JOIN pg_class c ON c.oid = i.index_table JOIN pg_namespace n ON n.oid = c.relnamespace
		ORDER BY 1`
	// sourceGuardsSQL lists the registered source columns and whether
	// enabled row triggers without a WHEN condition run
	// lethe.refuse_erased_source with the column as their first argument
	// (compared as bytes) on insert (tgtype bits 1 and 4) and on update
	// of the column (bits 1 and 16, not narrowed to other columns): one
	// trigger or two.
	sourceGuardsSQL = `SELECT n.nspname || '.' || c.relname, s.source_column::text,
			coalesce(bool_or(g.tgtype & 5 = 5), false)
			AND coalesce(bool_or(g.tgtype & 17 = 17 AND (cardinality(g.tgattr::int2[]) = 0 OR a.attnum = ANY (g.tgattr::int2[]))), false)
		FROM lethe.source_columns s
		JOIN pg_class c ON c.oid = s.source_table JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_attribute a ON a.attrelid = s.source_table AND a.attname = s.source_column
		LEFT JOIN LATERAL (SELECT t.tgtype, t.tgattr FROM pg_trigger t
			JOIN pg_proc f ON f.oid = t.tgfoid JOIN pg_namespace fn ON fn.oid = f.pronamespace
			WHERE t.tgrelid = s.source_table AND fn.nspname = 'lethe' AND f.proname = 'refuse_erased_source'
			  AND t.tgenabled IN ('O', 'A') AND t.tgqual IS NULL AND t.tgnargs >= 1
			  AND substring(t.tgargs FROM 1 FOR octet_length(convert_to(s.source_column::text, current_setting('server_encoding'))) + 1)
				= convert_to(s.source_column::text, current_setting('server_encoding')) || '\x00'::bytea) g ON true
		GROUP BY 1, 2
		ORDER BY 1, 2`
	// lineageGuardsSQL lists the registered lineage tables, whether an
	// enabled row trigger on insert (tgtype bits 1 and 4) runs
	// lethe.refuse_erased_lineage with the source column as its first
	// argument, and whether one runs lethe.require_lineage on the derived table.
	lineageGuardsSQL = `SELECT ln.nspname || '.' || lc.relname, t.source_column::text, dn.nspname || '.' || dc.relname,
			EXISTS (SELECT 1 FROM pg_trigger g JOIN pg_proc f ON f.oid = g.tgfoid JOIN pg_namespace fn ON fn.oid = f.pronamespace
				WHERE g.tgrelid = t.lineage_table AND fn.nspname = 'lethe' AND f.proname = 'refuse_erased_lineage'
				  AND g.tgenabled IN ('O', 'A') AND g.tgtype & 5 = 5 AND g.tgnargs >= 1
				  AND split_part(encode(g.tgargs, 'escape'), '\000', 1) = t.source_column::text),
			EXISTS (SELECT 1 FROM pg_trigger g JOIN pg_proc f ON f.oid = g.tgfoid JOIN pg_namespace fn ON fn.oid = f.pronamespace
				WHERE g.tgrelid = t.derived_table AND fn.nspname = 'lethe' AND f.proname = 'require_lineage'
				  AND g.tgenabled IN ('O', 'A') AND g.tgtype & 5 = 5)
		FROM lethe.lineage_tables t
		JOIN pg_class lc ON lc.oid = t.lineage_table JOIN pg_namespace ln ON ln.oid = lc.relnamespace
		JOIN pg_class dc ON dc.oid = t.derived_table JOIN pg_namespace dn ON dn.oid = dc.relnamespace
		ORDER BY 1`
)

// readGuards reads what the rules above look at into cat.
func readGuards(ctx context.Context, q Querier, cat *Catalog) error {
	keys, err := collect4(ctx, q, nonCascadingKeysSQL, cat.Schema)
	if err != nil {
		return fmt.Errorf("list foreign keys that do not cascade: %w", err)
	}
	for _, k := range keys {
		cat.NonCascadingKeys = append(cat.NonCascadingKeys, ForeignKey{Table: k[0], Columns: k[1], Parent: k[2], OnDelete: k[3]})
	}
	if cat.RowSecurity, err = readRowSecurity(ctx, q); err != nil {
		return fmt.Errorf("read row-level security: %w", err)
	}
	return readRegistryGuards(ctx, q, cat)
}

// readRowSecurity reads rowSecuritySQL by qualified table.
func readRowSecurity(ctx context.Context, q Querier) (map[string]RowSecurity, error) {
	rows, err := q.Query(ctx, rowSecuritySQL)
	if err != nil {
		return nil, err
	}
	out := map[string]RowSecurity{}
	var t string
	var rs RowSecurity
	_, err = pgx.ForEachRow(rows, []any{&t, &rs.Enabled, &rs.Forced, &rs.Policies}, func() error {
		out[t] = rs
		return nil
	})
	return out, err
}

// readRegistryGuards reads the registered content indexes and lineage
// tables with their triggers; none when the registry does not exist.
func readRegistryGuards(ctx context.Context, q Querier, cat *Catalog) error {
	var exists, sources bool
	if err := q.QueryRow(ctx, registryExistsSQL).Scan(&exists, &sources); err != nil {
		return fmt.Errorf("look for Lethe's registry: %w", err)
	}
	if cat.RegistryMissing = !exists; cat.RegistryMissing {
		return nil
	}
	if sources {
		if err := readSourceGuards(ctx, q, cat); err != nil {
			return err
		}
	}
	var err error
	if cat.ContentIndexes, err = collectStrings(ctx, q, contentIndexTablesSQL); err != nil {
		return fmt.Errorf("read %s: %w", contentIndexRegistry, err)
	}
	rows, err := q.Query(ctx, lineageGuardsSQL)
	if err != nil {
		return fmt.Errorf("read %s: %w", lineageRegistry, err)
	}
	var l GuardedLineage
	_, err = pgx.ForEachRow(rows, []any{&l.Table, &l.SourceColumn, &l.DerivedTable, &l.Guarded, &l.Required}, func() error {
		cat.Lineages = append(cat.Lineages, l)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", lineageRegistry, err)
	}
	return nil
}

// readSourceGuards reads the registered source columns with their triggers.
func readSourceGuards(ctx context.Context, q Querier, cat *Catalog) error {
	rows, err := q.Query(ctx, sourceGuardsSQL)
	if err != nil {
		return fmt.Errorf("read %s: %w", sourceRegistry, err)
	}
	var src GuardedSource
	_, err = pgx.ForEachRow(rows, []any{&src.Table, &src.Column, &src.Guarded}, func() error {
		cat.Sources = append(cat.Sources, src)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", sourceRegistry, err)
	}
	return nil
}

// collect4 runs a query of four text columns and returns its rows.
func collect4(ctx context.Context, q Querier, sql string, args ...any) ([][4]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	var out [][4]string
	var r [4]string
	_, err = pgx.ForEachRow(rows, []any{&r[0], &r[1], &r[2], &r[3]}, func() error {
		out = append(out, r)
		return nil
	})
	return out, err
}
