package postgres_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/postgres"
)

// compliantCatalog is a small store that keeps every rule: sessions with
// one cascading child, a content index and a derived table with its lineage.
func compliantCatalog() postgres.Catalog {
	guarded := postgres.RowSecurity{Enabled: true, Forced: true, Policies: 2}
	return postgres.Catalog{
		Schema:          "memory",
		Tables:          slices.Clone(postgres.ExpectedTables),
		SessionsExists:  true,
		SessionIDTables: []string{"memory.rounds"},
		DirectCascade:   []string{"memory.rounds"},
		CascadeEdges:    [][2]string{{"memory.rounds", "memory.sessions"}, {"d.derivations", "d.profiles"}},
		RowSecurity: map[string]postgres.RowSecurity{
			"memory.sessions": guarded, "memory.rounds": guarded, "d.cache": guarded, "d.profiles": guarded,
		},
		ContentIndexes: []string{"d.cache"},
		Lineages: []postgres.GuardedLineage{{Table: "d.derivations", SourceColumn: "source_session_id", DerivedTable: "d.profiles",
			Guarded: true, Required: true}},
	}
}

func TestAuditCatalogRules(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*postgres.Catalog)
		want   []string
	}{
		"compliant": {func(*postgres.Catalog) {}, nil},
		"a key to sessions that sets null, in another schema": {func(c *postgres.Catalog) {
			c.NonCascadingKeys = []postgres.ForeignKey{{Table: "x.stats", Columns: "conv", Parent: "memory.sessions", OnDelete: "SET NULL"}}
		}, []string{"NonCascadingKey x.stats.conv"}},
		"a key to a cascading table that restricts": {func(c *postgres.Catalog) {
			c.NonCascadingKeys = []postgres.ForeignKey{{Table: "x.notes", Columns: "round_id", Parent: "memory.rounds", OnDelete: "RESTRICT"}}
		}, []string{"NonCascadingKey x.notes.round_id"}},
		"a key to a table no session reaches is not the audit's business": {func(c *postgres.Catalog) {
			c.NonCascadingKeys = []postgres.ForeignKey{{Table: "x.a", Columns: "b_id", Parent: "d.profiles", OnDelete: "NO ACTION"}}
		}, nil},
		"a session_id whose key does not cascade is named once": {func(c *postgres.Catalog) {
			c.SessionIDTables = append(c.SessionIDTables, "memory.notes")
			c.NonCascadingKeys = []postgres.ForeignKey{{Table: "memory.notes", Columns: "session_id", Parent: "memory.sessions", OnDelete: "NO ACTION"}}
		}, []string{"NoCascade memory.notes.session_id"}},
		"row-level security missing on a cascading table": {func(c *postgres.Catalog) {
			c.CascadeEdges = append(c.CascadeEdges, [2]string{"memory.notes", "memory.rounds"})
		}, []string{"RowSecurityDisabled memory.notes"}},
		"not forced, no policy": {func(c *postgres.Catalog) {
			c.RowSecurity["memory.sessions"] = postgres.RowSecurity{Enabled: true}
		}, []string{"MissingPolicy memory.sessions", "RowSecurityNotForced memory.sessions"}},
		"the derived table and the content index are read paths": {func(c *postgres.Catalog) {
			delete(c.RowSecurity, "d.profiles")
			c.RowSecurity["d.cache"] = postgres.RowSecurity{Enabled: true, Policies: 1}
		}, []string{"RowSecurityDisabled d.profiles", "RowSecurityNotForced d.cache"}},
		"lineage triggers missing": {func(c *postgres.Catalog) {
			c.Lineages[0].Guarded, c.Lineages[0].Required = false, false
		}, []string{"MissingLineageGuard d.derivations.source_session_id", "MissingLineageRequirement d.profiles"}},
		"empty registries": {func(c *postgres.Catalog) {
			c.ContentIndexes, c.Lineages = nil, nil
			delete(c.RowSecurity, "d.cache")
		}, []string{"EmptyRegistry lethe.content_indexes", "EmptyRegistry lethe.lineage_tables"}},
	} {
		t.Run(name, func(t *testing.T) {
			cat := compliantCatalog()
			tc.change(&cat)
			rep := postgres.AuditCatalog(cat)
			if got := violationNames(rep); !slices.Equal(got, tc.want) {
				t.Errorf("violations %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAuditCatalogSaysWhenTheRegistryIsMissing(t *testing.T) {
	cat := compliantCatalog()
	cat.ContentIndexes, cat.Lineages, cat.RegistryMissing = nil, nil, true
	rep := postgres.AuditCatalog(cat)
	if len(rep.Violations) != 2 {
		t.Fatalf("violations %v, want the two registries", violationNames(rep))
	}
	for _, v := range rep.Violations {
		if !strings.Contains(v.Message, "does not exist (apply migration 00002)") {
			t.Errorf("%s %s: %q", v.Rule, v.Table, v.Message)
		}
	}
}
