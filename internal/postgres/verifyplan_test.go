package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/lethe-dev/lethe/internal/postgres"
)

// Verify's ledger check looks the requested sessions up by index: read the
// other way, every request verified reads the whole ledger, which holds a
// row per session ever erased (P3: O(n²) over a bulk run). Checked on a
// ledger of 20,000 rows, before the table is analyzed (as the bench's
// database, autovacuum off) and after.
func TestVerifyLedgerCheckUsesAnIndex(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, migratedDB(t))
	mustExec(t, conn, `INSERT INTO lethe.erasure_ledger (scope, record_id, request_uid, tombstoned_at, grace_ends_at, erased_at)
		SELECT 'session', gen_random_uuid()::text, 'uid-' || (i / 3), now(), now(), now() FROM generate_series(1, 20000) i`)
	ids := []string{"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"}
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			mustExec(t, conn, `ANALYZE lethe.erasure_ledger`)
		}
		rows, err := conn.Query(ctx, `EXPLAIN `+postgres.NotErasedSQL, ids)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan on erasure_ledger") || !strings.Contains(text, "erasure_ledger_active_idx") {
			t.Errorf("analyzed=%v: the check does not look the sessions up by erasure_ledger_active_idx:\n%s", analyzed, text)
		}
	}
	// The answer is that of the check without the index's predicate.
	var n int64
	if err := conn.QueryRow(ctx, postgres.NotErasedSQL, ids).Scan(&n); err != nil || n != 2 {
		t.Fatalf("two sessions no request erased: got %d, %v", n, err)
	}
}
