package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lethe-dev/lethe/internal/postgres"
)

// The store's audit lists the requests whose erasure the ledger holds, to
// find those no record holds any more: it must not read every session row.
func TestErasedRequestsListsErasuresByTheLedgerKey(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	// 4,000 requests of 10 session rows and one source row each; by request
	// number mod 5: erased an hour ago (t1), erased an hour ago (t2), erased
	// now (t1), tombstoned only (t1), cancelled (t1).
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tenant_id, tombstoned_at, grace_ends_at, erased_at, cancelled_at)
		SELECT CASE WHEN i % 11 = 10 THEN 'source' ELSE 'session' END, gen_random_uuid()::text,
			'uid-' || lpad((i / 11)::text, 5, '0'), CASE WHEN (i / 11) % 5 = 1 THEN 't2' ELSE 't1' END,
			now() - interval '2 hours', now() - interval '2 hours',
			CASE (i / 11) % 5 WHEN 0 THEN now() - interval '1 hour' WHEN 1 THEN now() - interval '1 hour' WHEN 2 THEN now() END,
			CASE WHEN (i / 11) % 5 = 4 THEN now() END
		FROM generate_series(0, 43999) i`)
	for _, state := range []string{"never analyzed", "analyzed"} {
		if state == "analyzed" {
			mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
		}
		sql := strings.NewReplacer("$1", "'t1'", "$2", "600").Replace(postgres.ErasedRequestsSQL)
		plan := strings.Join(queryStrings(t, conn, `EXPLAIN `+sql), "\n")
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "erasure_ledger_pkey") {
			t.Errorf("%s: the list does not walk the ledger's primary key:\n%s", state, plan)
		}
	}
	e := eraser(t, asRole(t, conn, dsn, "lethe_manager", "lethe_operator"), "t1")
	got, err := e.ErasedRequests(ctx, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for n := 0; n < 4000; n += 5 {
		want = append(want, fmt.Sprintf("uid-%05d", n))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tenant t1, erased over 10 minutes ago: %d requests (first %v), want %d (every fifth from uid-00000)", len(got), got[:min(len(got), 3)], len(want))
	}
	// Erased a moment ago: listed once older than the age asked for.
	if got, err = e.ErasedRequests(ctx, 0); err != nil || len(got) != 1600 {
		t.Fatalf("tenant t1, erased at any time: %d requests (%v), want 1,600", len(got), err)
	}
	all := eraser(t, asRole(t, conn, dsn, "lethe_manager", "lethe_operator"), "")
	if got, err = all.ErasedRequests(ctx, 10*time.Minute); err != nil || len(got) != 1600 {
		t.Fatalf("any tenant, erased over 10 minutes ago: %d requests (%v), want 1,600", len(got), err)
	}
}
