package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// auditCases break one erasure rule each on a migrated reference database;
// want is every violation the audit must report then, as "Rule table[.column]".
var auditCases = map[string]struct {
	setup string
	want  []string
}{
	"key from another schema on another column sets null": {
		`CREATE SCHEMA analytics;
		 CREATE TABLE analytics.session_stats (conversation uuid REFERENCES memory.sessions (id) ON DELETE SET NULL, turns int)`,
		[]string{"NonCascadingKey analytics.session_stats.conversation"},
	},
	"key restricts": {
		`CREATE TABLE public.bookmarks (sess uuid REFERENCES memory.sessions (id) ON DELETE RESTRICT)`,
		[]string{"NonCascadingKey public.bookmarks.sess"},
	},
	"key sets default": {
		`CREATE TABLE memory_derived.pins (origin uuid DEFAULT '00000000-0000-4000-8000-00000000000b'
			REFERENCES memory.sessions (id) ON DELETE SET DEFAULT)`,
		[]string{"NonCascadingKey memory_derived.pins.origin"},
	},
	"key to a cascading table does nothing": {
		`CREATE TABLE public.round_notes (round bigint REFERENCES memory.rounds (id), note text)`,
		[]string{"NonCascadingKey public.round_notes.round"},
	},
	"session_id without any key": {
		`CREATE TABLE memory.session_tags (session_id uuid, tag text)`,
		[]string{"NoCascade memory.session_tags.session_id"},
	},
	"session_id with a key that does not cascade is named once": {
		`CREATE TABLE memory.session_notes (session_id uuid REFERENCES memory.sessions (id), note text)`,
		[]string{"NoCascade memory.session_notes.session_id"},
	},
	"row-level security off on sessions": {
		`ALTER TABLE memory.sessions DISABLE ROW LEVEL SECURITY`,
		[]string{"RowSecurityDisabled memory.sessions"},
	},
	"row-level security not forced on a child": {
		`ALTER TABLE memory.rounds NO FORCE ROW LEVEL SECURITY`,
		[]string{"RowSecurityNotForced memory.rounds"},
	},
	"row-level security not forced on the content index": {
		`ALTER TABLE memory_derived.embedding_cache NO FORCE ROW LEVEL SECURITY`,
		[]string{"RowSecurityNotForced memory_derived.embedding_cache"},
	},
	"derived table without a permissive policy": {
		`DROP POLICY app_live_lineage ON memory_derived.profiles;
		 DROP POLICY lethe_operator_all ON memory_derived.profiles;
		 CREATE POLICY narrow ON memory_derived.profiles AS RESTRICTIVE USING (true)`,
		[]string{"MissingPolicy memory_derived.profiles"},
	},
	"a new cascading table readable by everyone": {
		`CREATE TABLE memory.session_notes (session_id uuid REFERENCES memory.sessions (id) ON DELETE CASCADE, note text)`,
		[]string{"RowSecurityDisabled memory.session_notes"},
	},
	"lineage guard dropped": {
		`DROP TRIGGER derivations_refuse_erased_lineage ON memory_derived.derivations`,
		[]string{"MissingLineageGuard memory_derived.derivations.source_session_id"},
	},
	"lineage guard disabled": {
		`ALTER TABLE memory_derived.derivations DISABLE TRIGGER derivations_refuse_erased_lineage`,
		[]string{"MissingLineageGuard memory_derived.derivations.source_session_id"},
	},
	"lineage guard on the wrong column": {
		`DROP TRIGGER derivations_refuse_erased_lineage ON memory_derived.derivations;
		 CREATE TRIGGER derivations_refuse_erased_lineage BEFORE INSERT OR UPDATE ON memory_derived.derivations
			FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_lineage('derived_id')`,
		[]string{"MissingLineageGuard memory_derived.derivations.source_session_id"},
	},
	"source guard dropped": {
		`DROP TRIGGER sessions_refuse_erased_source ON memory.sessions`,
		[]string{"MissingSourceGuard memory.sessions.source_path"},
	},
	"source guard disabled": {
		`ALTER TABLE memory.sessions DISABLE TRIGGER sessions_refuse_erased_source`,
		[]string{"MissingSourceGuard memory.sessions.source_path"},
	},
	"source guard on the wrong column": {
		`DROP TRIGGER sessions_refuse_erased_source ON memory.sessions;
		 CREATE TRIGGER sessions_refuse_erased_source BEFORE INSERT OR UPDATE ON memory.sessions
			FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_source('tenant_id')`,
		[]string{"MissingSourceGuard memory.sessions.source_path"},
	},
	"source guard on insert only": {
		`DROP TRIGGER sessions_refuse_erased_source ON memory.sessions;
		 CREATE TRIGGER sessions_refuse_erased_source BEFORE INSERT ON memory.sessions
			FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_source('source_path')`,
		[]string{"MissingSourceGuard memory.sessions.source_path"},
	},
	"source guard on updates of another column": {
		`DROP TRIGGER sessions_refuse_erased_source ON memory.sessions;
		 CREATE TRIGGER sessions_refuse_erased_source BEFORE INSERT OR UPDATE OF tenant_id ON memory.sessions
			FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_source('source_path')`,
		[]string{"MissingSourceGuard memory.sessions.source_path"},
	},
	"source guard only under a WHEN condition": {
		`DROP TRIGGER sessions_refuse_erased_source ON memory.sessions;
		 CREATE TRIGGER sessions_refuse_erased_source BEFORE INSERT OR UPDATE OF source_path ON memory.sessions
			FOR EACH ROW WHEN (NEW.tenant_id = 'nobody') EXECUTE FUNCTION lethe.refuse_erased_source('source_path')`,
		[]string{"MissingSourceGuard memory.sessions.source_path"},
	},
	"lineage requirement dropped": {
		`DROP TRIGGER profiles_require_lineage ON memory_derived.profiles`,
		[]string{"MissingLineageRequirement memory_derived.profiles"},
	},
	"no content index registered": {
		`DELETE FROM lethe.content_indexes`,
		[]string{"EmptyRegistry lethe.content_indexes"},
	},
	"no lineage table registered": {
		`DELETE FROM lethe.lineage_tables`,
		[]string{"EmptyRegistry lethe.lineage_tables"},
	},
}

// violationNames are the report's violations as "Rule table[.column]", sorted.
func violationNames(rep postgres.SchemaReport) []string {
	var out []string
	for _, v := range rep.Violations {
		w := v.Rule + " " + v.Table
		if v.Column != "" {
			w += "." + v.Column
		}
		out = append(out, w)
	}
	slices.Sort(out)
	return out
}

// Each broken rule makes the store's audit report exactly its violations,
// naming the table (and column), and makes a deletion tombstoned before the
// change refuse inside its own transaction, naming the table, with nothing
// deleted.
func TestAuditNamesEachBrokenRuleAndTheDeletionRefuses(t *testing.T) {
	for name, tc := range auditCases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := migratedDB(t)
			conn := connect(t, dsn)
			seedTenants(t, conn)
			e := eraser(t, dsn, "t1")
			req := erasure.Request{UID: "uid-rules", SessionIDs: []string{sessA}}
			if _, err := e.Tombstone(ctx, req); err != nil {
				t.Fatal(err)
			}
			// A pass that read the layout and the epoch before the change
			// (its Tombstone) tries the short way, which must decline.
			primed := primedPasses(t, dsn, conn)()
			if _, err := primed.Tombstone(ctx, req); err != nil {
				t.Fatal(err)
			}
			mustExec(t, conn, tc.setup)

			rep, err := postgres.AuditSchema(ctx, conn, "memory")
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Sorted(slices.Values(tc.want))
			if got := violationNames(rep); !slices.Equal(got, want) {
				t.Errorf("audit reports %v, want %v", got, want)
			}
			for _, v := range rep.Violations {
				if !strings.Contains(v.Message, v.Table) {
					t.Errorf("message of %s does not name %s: %q", v.Rule, v.Table, v.Message)
				}
			}

			table := strings.Fields(tc.want[0])[1]
			// A fresh Eraser takes the long way; the primed pass tries the
			// short way.
			for _, way := range []struct {
				name string
				e    *postgres.Eraser
			}{{"long way", e}, {"short way", primed}} {
				_, err = way.e.Delete(ctx, req, 10, 0)
				var ce *erasure.ConfigError
				if !errors.As(err, &ce) || ce.Reason != lethev1.ReasonSchemaChanged || !strings.Contains(ce.Message, table) {
					t.Fatalf("deletion (%s): %v, want a %s configuration error naming %s", way.name, err, lethev1.ReasonSchemaChanged, table)
				}
				if n := count(t, conn, `SELECT count(*) FROM memory.sessions WHERE id = $1`, sessA); n != 1 {
					t.Errorf("the session was deleted (%s) though the schema breaks the rules (%d left)", way.name, n)
				}
			}
			if w := primed.Ways(); w.Declined != 1 {
				t.Errorf("the primed pass's batches: %+v, want its batch declined by the short way", w)
			}
		})
	}
}

// Without Lethe's registry (migration 00002 not applied) the audit still
// answers, and names both registries.
func TestAuditWithoutLethesRegistry(t *testing.T) {
	ctx := context.Background()
	dsn, _ := databaseAt(t, 1)
	rep, err := postgres.AuditSchema(ctx, connect(t, dsn), "memory")
	if err != nil {
		t.Fatal(err)
	}
	got := violationNames(rep)
	for _, want := range []string{"EmptyRegistry lethe.content_indexes", "EmptyRegistry lethe.lineage_tables", "RowSecurityDisabled memory.sessions"} {
		if !slices.Contains(got, want) {
			t.Errorf("audit without the registry reports %v, want %q among them", got, want)
		}
	}
	for _, v := range rep.Violations {
		if v.Rule == lethev1.RuleEmptyRegistry && !strings.Contains(v.Message, "does not exist") {
			t.Errorf("%s: %q does not say the registry is missing", v.Table, v.Message)
		}
	}
}

// primedPasses returns a func that opens a pass: an Eraser of the
// database, as the manager opens one per pass, sharing with the others an
// audit memo. Before it returns, two passes have erased a session each,
// the first the long way (auditing the schema), the second the short way.
func primedPasses(t *testing.T, dsn string, conn *pgx.Conn) func() *postgres.Eraser {
	t.Helper()
	ctx := context.Background()
	base := eraser(t, dsn, "t1")
	memo := &postgres.AuditMemo{}
	pass := func() *postgres.Eraser {
		return &postgres.Eraser{Pool: base.Pool, Schema: base.Schema, TenantID: base.TenantID, Memo: memo}
	}
	for i, id := range seedTiny(t, conn, "cccccccc", 2) {
		e := pass()
		req := erasure.Request{UID: fmt.Sprintf("uid-prime-%d", i), SessionIDs: []string{id}}
		if _, err := e.Tombstone(ctx, req); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Delete(ctx, req, 10, 0); err != nil {
			t.Fatal(err)
		}
		if want := (postgres.BatchWays{Long: int64(1 - i), Short: int64(i)}); e.Ways() != want {
			t.Fatalf("priming pass %d: %+v, want %+v", i, e.Ways(), want)
		}
	}
	return pass
}

// Every shape of refusal that covers a registered source column on insert
// and on update of it passes the audit: one trigger on every update, or
// one trigger per event.
func TestAuditTakesEverySourceGuardThatRefuses(t *testing.T) {
	for name, setup := range map[string]string{
		"on insert or any update": `DROP TRIGGER sessions_refuse_erased_source ON memory.sessions;
			CREATE TRIGGER sessions_refuse_erased_source BEFORE INSERT OR UPDATE ON memory.sessions
				FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_source('source_path')`,
		"a trigger per event": `DROP TRIGGER sessions_refuse_erased_source ON memory.sessions;
			CREATE TRIGGER sessions_refuse_erased_source_ins BEFORE INSERT ON memory.sessions
				FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_source('source_path');
			CREATE TRIGGER sessions_refuse_erased_source_upd BEFORE UPDATE OF tenant_id, source_path ON memory.sessions
				FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_source('source_path')`,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			conn := connect(t, migratedDB(t))
			mustExec(t, conn, setup)
			rep, err := postgres.AuditSchema(ctx, conn, "memory")
			if err != nil {
				t.Fatal(err)
			}
			if got := violationNames(rep); len(got) != 0 {
				t.Errorf("audit reports %v, want none", got)
			}
		})
	}
}
