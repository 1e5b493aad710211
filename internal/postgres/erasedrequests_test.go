package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/postgres"
)

// The store's audit lists the requests whose erasure the ledger holds, to
// find those its record lacks: one probe per request, never every session
// row, and another tenant's wide requests cost it nothing more than a probe.
func TestErasedRequestsListsErasuresByTheLedgerKey(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	// 4,000 requests of 10 session rows and one source row each; by request
	// number mod 5: erased (t1), erased (t2), erased (t1), tombstoned only
	// (t1), cancelled (t1).
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, erased_at, cancelled_at)
		SELECT CASE WHEN i % 11 = 10 THEN 'source' ELSE 'session' END, gen_random_uuid()::text,
			'uid-' || lpad((i / 11)::text, 5, '0'), CASE WHEN (i / 11) % 5 = 1 THEN 't2' ELSE 't1' END,
			now() - interval '2 hours', now() - interval '2 hours',
			CASE WHEN (i / 11) % 5 < 3 THEN now() - interval '1 hour' END,
			CASE WHEN (i / 11) % 5 = 4 THEN now() END
		FROM generate_series(0, 43999) i`)
	e := eraser(t, asRole(t, conn, dsn, "lethe_manager", "lethe_operator"), "t1")
	got, err := e.ErasedRequests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for n := range 4000 {
		if n%5 == 0 || n%5 == 2 {
			want = append(want, fmt.Sprintf("uid-%05d", n))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tenant t1: %d requests (first %v), want %d (numbers 0 and 2 mod 5)", len(got), got[:min(len(got), 3)], len(want))
	}
	// What the audit writes into a record, for an erased, a tombstoned-only
	// and an unknown request, in one statement.
	les, err := e.LedgerErasures(ctx, []string{"uid-00000", "uid-00003", "uid-none"})
	if err != nil || len(les) != 3 {
		t.Fatalf("ledger erasures: %d (%v), want 3", len(les), err)
	}
	if le := les[0]; le.UID != "uid-00000" || le.Held != 0 || len(le.Sessions) != 10 || !slices.IsSorted(le.Sessions) || le.DeletedAt.IsZero() || len(le.Sources) != 1 {
		t.Errorf("erased request: %+v, want 10 sorted sessions, none held, a deletion time, its source", le)
	}
	if le := les[1]; le.Held != 10 || len(le.Sessions) != 0 || !le.DeletedAt.IsZero() || len(le.Sources) != 1 {
		t.Errorf("tombstoned request: %+v, want 10 held, no session erased, no deletion time, its source row", le)
	}
	if le := les[2]; le.Held != 0 || len(le.Sessions) != 0 || !le.DeletedAt.IsZero() {
		t.Errorf("unknown request: %+v, want nothing", le)
	}
	all := eraser(t, asRole(t, conn, dsn, "lethe_manager", "lethe_operator"), "")
	if got, err = all.ErasedRequests(ctx); err != nil || len(got) != 2400 {
		t.Fatalf("any tenant: %d requests (%v), want 2,400", len(got), err)
	}

	for _, state := range []string{"never analyzed", "analyzed"} {
		if state == "analyzed" {
			mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
		}
		plan := strings.Join(queryStrings(t, conn, `EXPLAIN `+strings.ReplaceAll(postgres.ErasedRequestsSQL, "$1", "'t1'")), "\n")
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "erasure_ledger_pkey") {
			t.Errorf("%s: the list does not walk the ledger's primary key:\n%s", state, plan)
		}
	}
	before := queryBuffers(t, conn, "t1")
	// 100 requests of another tenant, 2,000 session rows each, cancelled:
	// read row by row, they would cost thousands of pages.
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, cancelled_at)
		SELECT 'session', gen_random_uuid()::text, 'uid-t3-' || lpad((i / 2000)::text, 3, '0'), 't3', now(), now(), now()
		FROM generate_series(0, 199999) i`)
	mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
	after := queryBuffers(t, conn, "t1")
	t.Logf("pages read by the list for t1: %d, then %d with another tenant's 100 wide requests", before, after)
	if after-before > 1000 {
		t.Errorf("the list for t1 read %d pages with another tenant's 100 wide requests, %d without: it reads their rows", after, before)
	}
}

// queryBuffers is how many pages the list for tenant reads (shared hits
// and reads, its whole plan).
func queryBuffers(t *testing.T, conn *pgx.Conn, tenant string) int64 {
	t.Helper()
	var out []byte
	sql := `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ` + strings.ReplaceAll(postgres.ErasedRequestsSQL, "$1", "'"+tenant+"'")
	if err := conn.QueryRow(context.Background(), sql).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plans []struct {
		Ms   float64 `json:"Execution Time"`
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		}
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN output %s: %v", out, err)
	}
	t.Logf("the list for %s: %.1f ms", tenant, plans[0].Ms)
	return plans[0].Plan.Hit + plans[0].Plan.Read
}
