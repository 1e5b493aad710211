package postgres_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/postgres"
)

// Verify's ledger check looks each requested session up by index: read the
// other way, every request verified reads the whole ledger, which holds a
// row per session ever erased (P3: O(n²) over a bulk run). Checked on a
// ledger of 20,000 rows never analyzed (the bench's database runs without
// autovacuum), analyzed when it held 10 rows (stale, as between two
// autovacuum analyzes of a growing ledger), and freshly analyzed.
func TestVerifyLedgerCheckUsesAnIndex(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	insert := func(n int) {
		mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at, erased_at)
			SELECT 'session', gen_random_uuid()::text, 'uid-' || (i / 3), now(), now(), now() FROM generate_series(1, $1::int) i`, n)
	}
	ids := []string{"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"}
	lookup := regexp.MustCompile(`Index Scan using erasure_ledger_active_idx on erasure_ledger l .*\n\s+Index Cond: \(\(scope = 'session'::text\) AND \(record_id = `)
	for _, state := range []string{"never analyzed", "analyzed at 10 rows", "analyzed"} {
		switch state {
		case "never analyzed":
			insert(20000)
		case "analyzed at 10 rows":
			mustExec(t, conn, `TRUNCATE lethe.erasure_ledger`)
			insert(10)
			mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
			insert(20000)
		case "analyzed":
			mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
		}
		plan := strings.Join(queryStrings(t, conn, `EXPLAIN `+strings.ReplaceAll(postgres.NotErasedSQL, "$1", quoteArray(ids))), "\n")
		if strings.Contains(plan, "Seq Scan on erasure_ledger") || !lookup.MatchString(plan) {
			t.Errorf("%s: the check does not look each session up by erasure_ledger_active_idx on (scope, record_id):\n%s", state, plan)
		}
	}
	// One session erased, one never tombstoned, one cancelled: two are not erased.
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at, erased_at)
		VALUES ('session', 's-erased', 'uid-x', now(), now(), now())`)
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at, cancelled_at)
		VALUES ('session', 's-cancelled', 'uid-y', now(), now(), now())`)
	var n int64
	if err := conn.QueryRow(ctx, postgres.NotErasedSQL, []string{"s-erased", "s-never", "s-cancelled"}).Scan(&n); err != nil || n != 2 {
		t.Fatalf("of an erased, an untouched and a cancelled session, two are not erased: got %d, %v", n, err)
	}
}

// quoteArray is ids as a text[] literal (EXPLAIN plans the statement with
// its values, as the manager's unnamed statements are planned).
func quoteArray(ids []string) string {
	return "'{" + strings.Join(ids, ",") + "}'::text[]"
}

// The audit counts the requests under another erasure key, every audit of
// every store, by the partial index on key_id: a healthy ledger of any size
// costs it two empty index ranges, never a scan of the ledger.
func TestUnderOtherKeysCountUsesTheKeyIndex(t *testing.T) {
	conn := connect(t, migratedDB(t))
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at, key_id)
		SELECT CASE WHEN i % 2 = 0 THEN 'session' ELSE 'content' END, gen_random_uuid()::text, 'uid-' || (i / 10), now(), now(),
			CASE WHEN i % 2 = 1 THEN 'hmac-sha256:k1' END
		FROM generate_series(1, 40000) i`)
	for _, state := range []string{"never analyzed", "analyzed"} {
		if state == "analyzed" {
			mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
		}
		plan := strings.Join(queryStrings(t, conn, `EXPLAIN `+strings.ReplaceAll(postgres.UnderOtherKeysSQL, "$1", "'hmac-sha256:k1'")), "\n")
		if strings.Contains(plan, "Seq Scan on erasure_ledger") || !strings.Contains(plan, "erasure_ledger_key_id_idx") {
			t.Errorf("%s: the count does not read erasure_ledger_key_id_idx:\n%s", state, plan)
		}
	}
	// Every keyed row under another key than k0; the count stops at the
	// first 10,000 rows (here 20,000 rows of 4,000 requests, five each, one
	// request's rows on neighbouring index entries or not).
	var n int64
	if err := conn.QueryRow(context.Background(), postgres.UnderOtherKeysSQL, "hmac-sha256:k0").Scan(&n); err != nil || n < 2000 || n > 4000 {
		t.Fatalf("requests under another key than k0: %d (%v), want those of the first 10,000 rows (2,000 to 4,000)", n, err)
	}
	mustExec(t, conn, `DELETE FROM lethe.erasure_ledger WHERE request_uid >= 'uid-2'`)
	want := count(t, conn, `SELECT count(DISTINCT request_uid) FROM lethe.erasure_ledger WHERE key_id IS NOT NULL`)
	if err := conn.QueryRow(context.Background(), postgres.UnderOtherKeysSQL, "hmac-sha256:k0").Scan(&n); err != nil || n != want {
		t.Fatalf("requests under another key than k0 below the bound: %d (%v), want %d", n, err, want)
	}
	if err := conn.QueryRow(context.Background(), postgres.UnderOtherKeysSQL, "hmac-sha256:k1").Scan(&n); err != nil || n != 0 {
		t.Fatalf("requests under another key than k1: %d (%v), want 0", n, err)
	}
}
