package postgres

import (
	"context"
	"fmt"
	"slices"

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

// Layout is where a memory database keeps what an erasure must reach,
// discovered from the catalog and the lethe registry, never hard-coded.
type Layout struct {
	Sessions Table
	// Children are the tables with a session_id column and an ON DELETE
	// CASCADE key to sessions.
	Children []Table
	// Vectors are the vector columns on sessions and the children.
	Vectors []QColumn
	// ContentSources hold content hashes on sessions or the children, keyed
	// by "id" on sessions and "session_id" elsewhere.
	ContentSources []QColumn
	// ContentIndexes are content-keyed tables (table, key column).
	ContentIndexes []QColumn
	Lineages       []Lineage
}

// sessionKey is the column that names the session in t.
func (l Layout) sessionKey(t Table) string {
	if t == l.Sessions {
		return "id"
	}
	return "session_id"
}

// LoadLayout reads the layout of schema.
func LoadLayout(ctx context.Context, q Querier, schema string) (Layout, error) {
	cat, err := ReadCatalog(ctx, q, schema)
	if err != nil {
		return Layout{}, err
	}
	if !cat.SessionsExists {
		return Layout{}, fmt.Errorf("table %s.sessions does not exist", schema)
	}
	l := Layout{Sessions: Table{schema, "sessions"}}
	members := map[Table]bool{l.Sessions: true}
	for _, qualified := range cat.DirectCascade {
		t := splitTable(qualified)
		l.Children = append(l.Children, t)
		members[t] = true
	}
	for _, v := range cat.VectorColumns {
		if t := splitTable(v.Table); members[t] {
			l.Vectors = append(l.Vectors, QColumn{t, v.Column})
		}
	}

	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname, s.hash_column
		FROM lethe.content_sources s JOIN pg_class c ON c.oid = s.source_table JOIN pg_namespace n ON n.oid = c.relnamespace
		ORDER BY 1, 2, 3`)
	if err != nil {
		return l, fmt.Errorf("read lethe.content_sources (are Lethe's migrations applied?): %w", err)
	}
	var c QColumn
	if _, err := pgx.ForEachRow(rows, []any{&c.Table.Schema, &c.Table.Name, &c.Column}, func() error {
		if members[c.Table] {
			l.ContentSources = append(l.ContentSources, c)
		}
		return nil
	}); err != nil {
		return l, fmt.Errorf("read lethe.content_sources: %w", err)
	}

	rows, err = q.Query(ctx, `SELECT n.nspname, c.relname, i.key_column
		FROM lethe.content_indexes i JOIN pg_class c ON c.oid = i.index_table JOIN pg_namespace n ON n.oid = c.relnamespace
		ORDER BY 1, 2`)
	if err != nil {
		return l, fmt.Errorf("read lethe.content_indexes: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&c.Table.Schema, &c.Table.Name, &c.Column}, func() error {
		l.ContentIndexes = append(l.ContentIndexes, c)
		return nil
	}); err != nil {
		return l, fmt.Errorf("read lethe.content_indexes: %w", err)
	}

	rows, err = q.Query(ctx, `SELECT ln.nspname, lc.relname, t.source_column, format_type(a.atttypid, NULL), t.derived_column, dn.nspname, dc.relname, t.derived_key
		FROM lethe.lineage_tables t
		JOIN pg_class lc ON lc.oid = t.lineage_table JOIN pg_namespace ln ON ln.oid = lc.relnamespace
		JOIN pg_attribute a ON a.attrelid = t.lineage_table AND a.attname = t.source_column
		JOIN pg_class dc ON dc.oid = t.derived_table JOIN pg_namespace dn ON dn.oid = dc.relnamespace
		ORDER BY 1, 2`)
	if err != nil {
		return l, fmt.Errorf("read lethe.lineage_tables: %w", err)
	}
	var lin Lineage
	if _, err := pgx.ForEachRow(rows, []any{&lin.Table.Schema, &lin.Table.Name, &lin.SourceColumn, &lin.SourceType, &lin.DerivedColumn,
		&lin.Derived.Schema, &lin.Derived.Name, &lin.DerivedKey}, func() error {
		l.Lineages = append(l.Lineages, lin)
		return nil
	}); err != nil {
		return l, fmt.Errorf("read lethe.lineage_tables: %w", err)
	}
	slices.SortFunc(l.Children, func(a, b Table) int { return compareStr(a.String(), b.String()) })
	return l, nil
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
	for i := 0; i < len(qualified); i++ {
		if qualified[i] == '.' {
			return Table{qualified[:i], qualified[i+1:]}
		}
	}
	return Table{"", qualified}
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
