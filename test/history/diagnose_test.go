package history

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// explainCache describes, for a violation report, the content-keyed entries
// of session s left after its erasure: which of the fixture's texts each
// is, the tenants it lists, and the ledger rows that name its key; then the
// run's receipts. Fixture text only: the run's own test data.
func explainCache(ctx context.Context, conn *pgx.Conn, p *runPlan, s string) string {
	names := map[string]string{}
	var uids []string
	for _, r := range p.Requests {
		names[r.UID] = r.Name
		uids = append(uids, r.UID)
	}
	name := func(uid string) string {
		if n, ok := names[uid]; ok {
			return n
		}
		return uid
	}
	var b strings.Builder
	rows, err := conn.Query(ctx, `SELECT split_part(c.text, ' of ', 1), coalesce(array_to_string(c.tenant_ids, '+'), 'NULL'),
		coalesce((SELECT string_agg(l.request_uid || '/' || coalesce(l.tenant_id, '-') || '/erased=' || (l.erased_at IS NOT NULL) ||
			'/cancelled=' || (l.cancelled_at IS NOT NULL), ' ') FROM lethe.erasure_ledger l
			WHERE l.scope = 'content' AND l.record_id = lethe.content_hash(c.content_sha256)), 'no ledger row')
		FROM memory_derived.embedding_cache c WHERE strpos(c.text, $1) > 0 ORDER BY 1`, s)
	if err != nil {
		return "explain: " + err.Error()
	}
	var kind, tenants, ledger string
	_, err = pgx.ForEachRow(rows, []any{&kind, &tenants, &ledger}, func() error {
		for uid, n := range names {
			ledger = strings.ReplaceAll(ledger, uid, n)
		}
		fmt.Fprintf(&b, "; entry %q tenants %s ledger [%s]", kind, tenants, ledger)
		return nil
	})
	if err != nil {
		return "explain: " + err.Error()
	}
	rows, err = conn.Query(ctx, `SELECT request_uid, step, batch, sessions, counts::text FROM lethe.erasure_receipts
		WHERE request_uid = ANY($1) ORDER BY recorded_at, step, batch`, uids)
	if err != nil {
		return "explain: " + err.Error()
	}
	var uid, step, counts string
	var batch, sessions int
	_, err = pgx.ForEachRow(rows, []any{&uid, &step, &batch, &sessions, &counts}, func() error {
		fmt.Fprintf(&b, "; receipt %s/%s/%d: %d session(s) %s", name(uid), step, batch, sessions, counts)
		return nil
	})
	if err != nil {
		return "explain: " + err.Error()
	}
	var ses string
	err = conn.QueryRow(ctx, `SELECT coalesce(string_agg(request_uid || '/erased=' || (erased_at IS NOT NULL) || '/cancelled=' || (cancelled_at IS NOT NULL), ' '), 'none')
		FROM lethe.erasure_ledger WHERE scope = 'session' AND record_id = $1`, s).Scan(&ses)
	if err != nil {
		return "explain: " + err.Error()
	}
	for uid, n := range names {
		ses = strings.ReplaceAll(ses, uid, n)
	}
	return b.String() + "; session ledger rows: " + ses
}
