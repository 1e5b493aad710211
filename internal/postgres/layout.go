package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Table is a schema-qualified table.
type Table struct {
	Schema string
	Name   string
}

func (t Table) String() string { return t.Schema + "." + t.Name }

// Ident is the table quoted for SQL.
func (t Table) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// QColumn is a column of a table.
type QColumn struct {
	Table  Table
	Column string
}

// Ident is the column name quoted for SQL.
func (c QColumn) Ident() string { return pgx.Identifier{c.Column}.Sanitize() }

func (c QColumn) String() string { return c.Table.String() + "." + c.Column }

// Lineage is one registered lineage table.
type Lineage struct {
	Table        Table
	SourceColumn string
	// SourceType is the SQL type of the source column (uuid or text), so
	// that lookups compare without a cast and use its index.
	SourceType    string
	DerivedColumn string
	Derived       Table
	DerivedKey    string
}

// ContentIndex is a registered content-keyed table: its key column, and
// the column recording the tenants that use a row, if it has one.
type ContentIndex struct {
	QColumn
	// TenantColumn is "" when the table records no tenants: an erasure then
	// deletes the entries of its content for every tenant.
	TenantColumn string
	// TenantList is true for a text[] column (the tenants sharing a row),
	// false for a text column (one row per tenant).
	TenantList bool
}

// Tenants is the SQL expression, over the table aliased as alias, of the
// tenants a row lists: never NULL, without NULL elements.
func (c ContentIndex) Tenants(alias string) string {
	col := alias + "." + pgx.Identifier{c.TenantColumn}.Sanitize()
	if !c.TenantList {
		col = "ARRAY[" + col + "]"
	}
	return "coalesce(array_remove(" + col + ", NULL), '{}')"
}

// Layout is where a memory database keeps what an erasure must reach,
// discovered from the catalog and the lethe registry, never hard-coded.
type Layout struct {
	Sessions Table
	// Children are the tables with a session_id column and an ON DELETE
	// CASCADE key to sessions.
	Children []Table
	// Vectors are the vector columns on sessions and the children.
	Vectors []QColumn
	// Texts are the string columns on sessions and the children that the
	// role may read: the text residue probe samples them.
	Texts []QColumn
	// ContentSources hold content hashes on sessions or the children, keyed
	// by "id" on sessions and "session_id" elsewhere.
	ContentSources []QColumn
	// ContentIndexes are content-keyed tables.
	ContentIndexes []ContentIndex
	Lineages       []Lineage
	// SourceColumns hold the sessions' source identifiers (a transcript
	// path): the ledger keeps their keyed hashes, so a source is not ingested
	// again (lethe.source_columns; only columns of the sessions table count).
	SourceColumns []QColumn
	// SourceReach lists, as "parent child", the tables a read of a content
	// or source column's table reaches besides it: its partitions and
	// inheriting tables, at any depth.
	SourceReach []string
	// LedgerTagsLayout is true when the ledger's session rows record the
	// layout their content rows were written under (migration 00018).
	LedgerTagsLayout bool
}

// ContentDigest identifies what a tombstone's content and source rows are
// written from: the sessions table, the tables cascading from it, the
// content and source columns in the cascade (each read by the session's
// key) and the partitions and inheriting tables a read of theirs reaches
// (attaching a partition that holds a session's rows adds content).
func (l Layout) ContentDigest() string {
	h := sha256.New()
	fmt.Fprintf(h, "sessions %s\n", l.Sessions)
	children := slices.Clone(l.Children)
	slices.SortFunc(children, func(a, b Table) int { return strings.Compare(a.String(), b.String()) })
	for _, c := range children {
		fmt.Fprintf(h, "child %q %q\n", c.Schema, c.Name)
	}
	for _, r := range l.SourceReach {
		fmt.Fprintf(h, "reach %q\n", r)
	}
	for _, kind := range []struct {
		name string
		cols []QColumn
	}{{"content", l.ContentSources}, {"source", l.SourceColumns}} {
		cols := slices.Clone(kind.cols)
		slices.SortFunc(cols, func(a, b QColumn) int { return strings.Compare(a.String(), b.String()) })
		for _, c := range cols {
			fmt.Fprintf(h, "%s %q %q %q by %q\n", kind.name, c.Table.Schema, c.Table.Name, c.Column, l.sessionKey(c.Table))
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// sourceReachSQL lists the partitions and inheriting tables, at any depth,
// of the tables named by the schemas $1 and names $2, as "parent child"
// (quoted qualified names, whatever the search path), sorted. A table
// dropped or renamed since the registry was read is left out, not an
// error (the epoch read around the layout notices the change).
const sourceReachSQL = `WITH RECURSIVE roots AS (
		SELECT c.oid FROM unnest($1::text[], $2::text[]) AS t(s, r)
		JOIN pg_namespace n ON n.nspname = t.s JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.r),
	d(parent, child) AS (
		SELECT i.inhparent, i.inhrelid FROM pg_inherits i WHERE i.inhparent IN (SELECT oid FROM roots)
		UNION SELECT d.parent, i.inhrelid FROM d JOIN pg_inherits i ON i.inhparent = d.child)
	SELECT format('%I.%I', pn.nspname, p.relname) || ' ' || format('%I.%I', cn.nspname, c.relname)
	FROM d JOIN pg_class p ON p.oid = d.parent JOIN pg_namespace pn ON pn.oid = p.relnamespace
	JOIN pg_class c ON c.oid = d.child JOIN pg_namespace cn ON cn.oid = c.relnamespace
	ORDER BY 1`

// readSourceReach fills SourceReach for the content and source columns' tables.
func (l *Layout) readSourceReach(ctx context.Context, q Querier) error {
	var schemas, names []string
	var seen []Table
	for _, c := range slices.Concat(l.ContentSources, l.SourceColumns) {
		if !slices.Contains(seen, c.Table) {
			seen = append(seen, c.Table)
			schemas, names = append(schemas, c.Table.Schema), append(names, c.Table.Name)
		}
	}
	if len(seen) == 0 {
		return nil
	}
	var err error
	if l.SourceReach, err = collectStrings(ctx, q, sourceReachSQL, schemas, names); err != nil {
		return fmt.Errorf("read the partitions of the content sources: %w", err)
	}
	return nil
}

// ledgerTagsLayoutSQL is whether migration 00018's column exists.
const ledgerTagsLayoutSQL = `SELECT EXISTS (SELECT 1 FROM pg_attribute
	WHERE attrelid = 'lethe.erasure_ledger'::regclass AND attname = 'layout_digest' AND NOT attisdropped)`

const (
	// contentSourcesSQL reads the registered content-hash columns.
	contentSourcesSQL = `SELECT n.nspname, c.relname, s.hash_column
		FROM lethe.content_sources s JOIN pg_class c ON c.oid = s.source_table JOIN pg_namespace n ON n.oid = c.relnamespace
		ORDER BY 1, 2, 3`
	// sourceColumnsSQL reads the registered source-identifier columns.
	sourceColumnsSQL = `SELECT n.nspname, c.relname, s.source_column
		FROM lethe.source_columns s JOIN pg_class c ON c.oid = s.source_table JOIN pg_namespace n ON n.oid = c.relnamespace
		ORDER BY 1, 2, 3`
	// contentIndexesSQL reads the registered content-keyed tables, with the
	// type of their tenant column ("" when none is registered, NULL when the
	// registered one does not exist).
	contentIndexesSQL = `SELECT n.nspname, c.relname, i.key_column, coalesce(i.tenant_column, ''),
			CASE WHEN i.tenant_column IS NULL THEN '' ELSE format_type(a.atttypid, NULL) END
		FROM lethe.content_indexes i JOIN pg_class c ON c.oid = i.index_table JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_attribute a ON a.attrelid = i.index_table AND a.attname = i.tenant_column AND NOT a.attisdropped
		ORDER BY 1, 2`
	// lineageTablesSQL reads the registered lineage tables.
	lineageTablesSQL = `SELECT ln.nspname, lc.relname, t.source_column, format_type(a.atttypid, NULL), t.derived_column, dn.nspname, dc.relname, t.derived_key
		FROM lethe.lineage_tables t
		JOIN pg_class lc ON lc.oid = t.lineage_table JOIN pg_namespace ln ON ln.oid = lc.relnamespace
		JOIN pg_attribute a ON a.attrelid = t.lineage_table AND a.attname = t.source_column
		JOIN pg_class dc ON dc.oid = t.derived_table JOIN pg_namespace dn ON dn.oid = dc.relnamespace
		ORDER BY 1, 2`
)

// LoadLayout reads the layout of schema.
func LoadLayout(ctx context.Context, q Querier, schema string) (Layout, error) {
	cat, err := ReadCatalog(ctx, q, schema)
	if err != nil {
		return Layout{}, err
	}
	if !cat.SessionsExists {
		return Layout{}, fmt.Errorf("table %s.sessions does not exist", schema)
	}
	l := cascadeLayout(cat)
	if l.Texts, err = cascadeTexts(ctx, q, l); err != nil {
		return l, err
	}
	return l, l.readRegistry(ctx, q)
}

// cascadeLayout is the part of the layout the catalog gives: sessions, the
// tables cascading from it and their vector columns.
func cascadeLayout(cat Catalog) Layout {
	l := Layout{Sessions: Table{cat.Schema, "sessions"}}
	for _, qualified := range cat.DirectCascade {
		l.Children = append(l.Children, splitTable(qualified))
	}
	slices.SortFunc(l.Children, func(a, b Table) int { return strings.Compare(a.String(), b.String()) })
	members := l.inCascade()
	for _, v := range cat.VectorColumns {
		if t := splitTable(v.Table); members[t] {
			l.Vectors = append(l.Vectors, QColumn{t, v.Column})
		}
	}
	return l
}

// inCascade is the set of sessions and the tables cascading from it.
func (l Layout) inCascade() map[Table]bool {
	members := map[Table]bool{l.Sessions: true}
	for _, t := range l.Children {
		members[t] = true
	}
	return members
}

// readRegistry reads what Lethe's registry (lethe.content_sources,
// lethe.content_indexes, lethe.lineage_tables) adds to the layout.
func (l *Layout) readRegistry(ctx context.Context, q Querier) error {
	sources, err := readColumns(ctx, q, contentSourcesSQL)
	if err != nil {
		return fmt.Errorf("read lethe.content_sources (are Lethe's migrations applied?): %w", err)
	}
	members := l.inCascade()
	for _, c := range sources {
		if members[c.Table] {
			l.ContentSources = append(l.ContentSources, c)
		}
	}
	if l.ContentIndexes, err = readContentIndexes(ctx, q); err != nil {
		return fmt.Errorf("read lethe.content_indexes: %w", err)
	}
	if l.Lineages, err = readLineages(ctx, q); err != nil {
		return fmt.Errorf("read lethe.lineage_tables: %w", err)
	}
	if err := l.readSourceColumns(ctx, q); err != nil {
		return err
	}
	if err := l.readSourceReach(ctx, q); err != nil {
		return err
	}
	if err := q.QueryRow(ctx, ledgerTagsLayoutSQL).Scan(&l.LedgerTagsLayout); err != nil {
		return fmt.Errorf("read lethe.erasure_ledger's columns: %w", err)
	}
	return nil
}

// readSourceColumns keeps the registered source columns of the sessions table.
func (l *Layout) readSourceColumns(ctx context.Context, q Querier) error {
	cols, err := readColumns(ctx, q, sourceColumnsSQL)
	if err != nil {
		return fmt.Errorf("read lethe.source_columns: %w", err)
	}
	for _, c := range cols {
		if c.Table == l.Sessions {
			l.SourceColumns = append(l.SourceColumns, c)
		}
	}
	return nil
}

// readColumns runs a query of (schema, table, column) rows.
func readColumns(ctx context.Context, q Querier, sql string) ([]QColumn, error) {
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	var out []QColumn
	var c QColumn
	_, err = pgx.ForEachRow(rows, []any{&c.Table.Schema, &c.Table.Name, &c.Column}, func() error {
		out = append(out, c)
		return nil
	})
	return out, err
}

// readContentIndexes reads the content indexes; a tenant column must be
// text[] or text.
func readContentIndexes(ctx context.Context, q Querier) ([]ContentIndex, error) {
	rows, err := q.Query(ctx, contentIndexesSQL)
	if err != nil {
		return nil, err
	}
	var out []ContentIndex
	var c ContentIndex
	var typ *string
	_, err = pgx.ForEachRow(rows, []any{&c.Table.Schema, &c.Table.Name, &c.Column, &c.TenantColumn, &typ}, func() error {
		switch {
		case typ == nil:
			return fmt.Errorf("tenant column %q of %s does not exist", c.TenantColumn, c.Table)
		case *typ == "text[]":
			c.TenantList = true
		case *typ == "text" || *typ == "":
			c.TenantList = false
		default:
			return fmt.Errorf("tenant column %q of %s is %s, want text[] or text", c.TenantColumn, c.Table, *typ)
		}
		out = append(out, c)
		return nil
	})
	return out, err
}

func readLineages(ctx context.Context, q Querier) ([]Lineage, error) {
	rows, err := q.Query(ctx, lineageTablesSQL)
	if err != nil {
		return nil, err
	}
	var out []Lineage
	var lin Lineage
	_, err = pgx.ForEachRow(rows, []any{&lin.Table.Schema, &lin.Table.Name, &lin.SourceColumn, &lin.SourceType, &lin.DerivedColumn,
		&lin.Derived.Schema, &lin.Derived.Name, &lin.DerivedKey}, func() error {
		out = append(out, lin)
		return nil
	})
	return out, err
}

// SourceMatch is the condition "source column is one of $n" for this
// lineage table, typed as the column so that its index is used.
func (l Lineage) SourceMatch(param int) string {
	typ := "text"
	if l.SourceType == "uuid" {
		typ = "uuid"
	}
	return fmt.Sprintf("%s = ANY($%d::%s[])", pgx.Identifier{l.SourceColumn}.Sanitize(), param, typ)
}

func splitTable(qualified string) Table {
	schema, name, ok := strings.Cut(qualified, ".")
	if !ok {
		return Table{"", qualified}
	}
	return Table{schema, name}
}
