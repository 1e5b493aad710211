package history

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/api/meta"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// notHeldReport says, for a restore finding, what of the run's erasures
// does not hold: the rows left of what its requests had erased, and per
// request its phase, the reason of its Deleted condition, the Resurrected
// entries it recorded since the restore, and what the database holds of it
// (sessions back, erased session rows, source rows). Counts and names only.
func (r *restoreFault) notHeldReport(ctx context.Context, e *env, db *database, p *runPlan) string {
	var parts []string
	var rows map[string]int64
	err := db.do(ctx, func(conn *pgx.Conn) error {
		var err error
		rows, err = rowsPerSession(ctx, conn, mustBeErased(p, r.atRestore[p]))
		return err
	})
	if err != nil {
		return "report: " + err.Error()
	}
	left := 0
	for _, n := range rows {
		if n != 0 {
			left++
		}
	}
	parts = append(parts, fmt.Sprintf("%d of %d erased sessions have rows", left, len(rows)))
	now, err := requestStates(ctx, e, p, r.deletedObject(p))
	if err != nil {
		return "report: " + err.Error()
	}
	names := make([]string, 0, len(now))
	for name := range now {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		parts = append(parts, r.requestReport(ctx, db, name, now[name]))
	}
	return strings.Join(parts, "; ")
}

// requestReport is one request's line of notHeldReport.
func (r *restoreFault) requestReport(ctx context.Context, db *database, name string, er *lethev1.ErasureRequest) string {
	deleted := "none"
	if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionDeleted); c != nil {
		deleted = string(c.Status) + "/" + c.Reason
	}
	since := 0
	if before := r.atRestore[r.runOf(name, er)]; before != nil && before[name] != nil {
		since = len(before[name].Status.History)
	}
	req := erasure.FoundRequest(er)
	var back, erased, sources int64
	err := db.do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM memory.sessions WHERE id::text = ANY($2::text[])),
			(SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL),
			(SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'source' AND cancelled_at IS NULL)`,
			string(er.UID), req.SessionIDs).Scan(&back, &erased, &sources)
	})
	if err != nil {
		return name + ": " + err.Error()
	}
	return fmt.Sprintf("%s: %s, Deleted %s, %d Resurrected since the restore, %d of %d found sessions back, %d erased session rows, %d source rows",
		name, er.Status.Phase, deleted, resurrections(er.Status.History[min(since, len(er.Status.History)):]),
		back, len(req.SessionIDs), erased, sources)
}

// runOf is the run whose requests at the restore hold er.
func (r *restoreFault) runOf(name string, er *lethev1.ErasureRequest) *runPlan {
	for p, states := range r.atRestore {
		if s := states[name]; s != nil && s.UID == er.UID {
			return p
		}
	}
	return nil
}
