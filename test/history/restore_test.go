package history

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A restore of the memory database, as an operator runs one from a backup:
// the round's pg_dump is taken after seeding, before the requests; once
// every request of the round is done (at times after deleting one completed
// request object, so that only its store's record knows what it erased), the
// database is dropped and filled again from the dump by pg_restore while the
// manager runs and the other faults go on. The requests (kept by the API
// server) and the stores' audits must erase again what came back.

const (
	// restoreHoldBound is how long the erasures may take to hold again
	// after a restore; passing it is a violation, not a hang.
	restoreHoldBound = 2 * time.Minute
	// deleteBound is how long a deleted request object may take to go.
	deleteBound = 30 * time.Second
)

// database is the test's own superuser connection, shared by the round's
// goroutines (one statement at a time) and opened again after a restore
// ended it.
type database struct {
	mu   sync.Mutex
	dsn  string
	conn *pgx.Conn
	// restored is set once the round's restore is done: attempts made
	// since read the restored database.
	restored bool
}

// do runs fn with the connection, reconnecting first if it was closed.
func (d *database) do(ctx context.Context, fn func(*pgx.Conn) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil || d.conn.IsClosed() {
		c, err := connect(ctx, d.dsn)
		if err != nil {
			return err
		}
		d.conn = c
	}
	return fn(d.conn)
}

// within runs fn under a context of the given timeout that starts once the
// connection is free: a restore holds it for as long as pg_restore takes, and
// an attempt waiting behind it must not spend its deadline there.
func (d *database) within(timeout time.Duration, fn func(context.Context, *pgx.Conn) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if d.conn == nil || d.conn.IsClosed() {
		c, err := connect(ctx, d.dsn)
		if err != nil {
			return err
		}
		d.conn = c
	}
	return fn(ctx, d.conn)
}

func (d *database) close(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil {
		_ = d.conn.Close(ctx)
	}
}

// name is the database's name.
func (d *database) name() (string, error) {
	u, err := url.Parse(d.dsn)
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(u.Path, "/"), nil
}

// restoreFault is a round's restore.
type restoreFault struct {
	file      string // the dump
	deleteOne bool   // delete one completed request object before the restore
	rng       *rand.Rand

	deleted    *lethev1.ErasureRequest // the request object deleted, in its last state
	deletedRun *runPlan
	at         time.Time  // the database's clock just before the drop
	effects    []dbEffect // recorded up to the restore
	atRestore  map[*runPlan]map[string]*lethev1.ErasureRequest
	findings   map[*runPlan][]string
	detected   map[*runPlan]bool // the store's audit said RestoreDetected
}

// dump takes the round's pg_dump of the memory database.
func (r *restoreFault) dump(e *env, db *database) error {
	name, err := db.name()
	if err != nil {
		return err
	}
	return e.pg.Dump(name, r.file)
}

// deleteCompleted deletes one completed request object, at random (half
// the time one that shares a session with another completed request of its
// run, when there is one: after the restore the other may erase the shared
// session first), and waits until the finalizer let it go.
func (r *restoreFault) deleteCompleted(ctx context.Context, e *env, plans []*runPlan) error {
	type cand struct {
		p       *runPlan
		r       *plannedRequest
		overlap bool
	}
	var cands []cand
	for _, p := range plans {
		states, err := requestStates(ctx, e, p, nil)
		if err != nil {
			return err
		}
		completed := func(pr *plannedRequest) bool { return states[pr.Name].Status.Phase == lethev1.PhaseBackupsRotated }
		for _, pr := range p.Requests {
			if !completed(pr) {
				continue
			}
			c := cand{p: p, r: pr}
			for _, other := range p.Requests {
				c.overlap = c.overlap || other != pr && completed(other) && slices.ContainsFunc(pr.Sessions, func(s string) bool {
					return slices.Contains(p.Own, s) && slices.Contains(other.Sessions, s)
				})
			}
			cands = append(cands, c)
		}
	}
	r.rng.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	if r.rng.IntN(2) == 0 {
		slices.SortStableFunc(cands, func(x, y cand) int {
			if x.overlap == y.overlap {
				return 0
			}
			if x.overlap {
				return -1
			}
			return 1
		})
	}
	for _, c := range cands {
		er := &lethev1.ErasureRequest{}
		if err := e.k8s.Get(ctx, keyOf(c.p.NS, c.r.Name), er); err != nil {
			return err
		}
		if err := e.k8s.Delete(ctx, er); err != nil {
			return err
		}
		r.deleted, r.deletedRun = er, c.p
		for deadline := time.Now().Add(deleteBound); ; time.Sleep(100 * time.Millisecond) {
			err := e.k8s.Get(ctx, keyOf(c.p.NS, c.r.Name), &lethev1.ErasureRequest{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("run %d: completed request %s was not removed within %s of its deletion (%w)", c.p.ID, c.r.Name, deleteBound, err)
			}
		}
	}
	return nil
}

// restore records the requests and the effects as the restore finds them,
// then drops the database and restores the dump. The test's connection is
// held throughout: no attempt or connection drop runs half-way.
func (r *restoreFault) restore(ctx context.Context, e *env, db *database, plans []*runPlan, seq int64) error {
	r.atRestore = map[*runPlan]map[string]*lethev1.ErasureRequest{}
	for _, p := range plans {
		states, err := requestStates(ctx, e, p, r.deletedObject(p))
		if err != nil {
			return err
		}
		r.atRestore[p] = states
	}
	name, err := db.name()
	if err != nil {
		return err
	}
	return db.do(ctx, func(conn *pgx.Conn) error {
		// Effects committed after this read and before the drop are lost
		// with the database they were in; the window is a few milliseconds.
		var err error
		if r.effects, err = effectsSince(ctx, conn, seq); err != nil {
			return err
		}
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&r.at); err != nil {
			return err
		}
		_ = conn.Close(ctx)
		if err := e.pg.Restore(ctx, name, r.file); err != nil {
			return err
		}
		_ = os.Remove(r.file)
		db.restored = true
		return nil
	})
}

func (r *restoreFault) deletedObject(p *runPlan) *lethev1.ErasureRequest {
	if r.deletedRun == p {
		return r.deleted
	}
	return nil
}

// requestStates reads the run's requests; a request whose object was
// deleted is given as it was before (deleted).
func requestStates(ctx context.Context, e *env, p *runPlan, deleted *lethev1.ErasureRequest) (map[string]*lethev1.ErasureRequest, error) {
	out := map[string]*lethev1.ErasureRequest{}
	for _, r := range p.Requests {
		if deleted != nil && deleted.Name == r.Name {
			out[r.Name] = deleted
			continue
		}
		er := &lethev1.ErasureRequest{}
		if err := e.k8s.Get(ctx, keyOf(p.NS, r.Name), er); err != nil {
			return nil, err
		}
		out[r.Name] = er
	}
	return out, nil
}

// mustBeErased is what the run's requests had erased before the restore:
// the tenant's sessions of the requests that completed.
func mustBeErased(p *runPlan, states map[string]*lethev1.ErasureRequest) []string {
	var out []string
	for _, r := range p.Requests {
		if er := states[r.Name]; er == nil || er.Status.Phase != lethev1.PhaseBackupsRotated {
			continue
		}
		for _, s := range r.Sessions {
			if slices.Contains(p.Own, s) && !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// held says whether the run's erasures hold again: no row left of what its
// requests had erased, and a Resurrected entry in the history of every
// request object that had deleted, beyond what it had at the restore.
func (r *restoreFault) held(ctx context.Context, e *env, db *database, p *runPlan) (bool, error) {
	var rows map[string]int64
	if err := db.do(ctx, func(conn *pgx.Conn) error {
		var err error
		rows, err = rowsPerSession(ctx, conn, mustBeErased(p, r.atRestore[p]))
		return err
	}); err != nil {
		return false, err
	}
	for _, n := range rows {
		if n != 0 {
			return false, nil
		}
	}
	now, err := requestStates(ctx, e, p, r.deletedObject(p))
	if err != nil {
		return false, err
	}
	for name, before := range r.atRestore[p] {
		if before == r.deleted || !meta.IsStatusConditionTrue(before.Status.Conditions, lethev1.ConditionDeleted) {
			continue
		}
		if resurrections(now[name].Status.History[min(len(before.Status.History), len(now[name].Status.History)):]) == 0 {
			return false, nil
		}
	}
	return true, nil
}

func resurrections(h []lethev1.HistoryEntry) int {
	n := 0
	for _, e := range h {
		if e.Event == lethev1.ReasonResurrected {
			n++
		}
	}
	return n
}

// waitHeld waits, within restoreHoldBound of the restore, until every run's
// erasures hold again; it notes the stores whose audit saw the restore.
// It returns when they held (zero: the bound passed first).
func (r *restoreFault) waitHeld(ctx context.Context, e *env, api *apiRecorder, db *database, plans []*runPlan) (time.Time, error) {
	r.detected, r.findings = map[*runPlan]bool{}, map[*runPlan][]string{}
	deadline := time.Now().Add(restoreHoldBound)
	for {
		if err := api.err(); err != nil {
			return time.Time{}, err
		}
		all := true
		for _, p := range plans {
			if _, seen := api.storeIntact(p); seen {
				r.detected[p] = true
			}
			ok, err := r.held(ctx, e, db, p)
			if err != nil {
				return time.Time{}, err
			}
			all = all && ok
		}
		if all {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			for _, p := range plans {
				if ok, err := r.held(ctx, e, db, p); err == nil && !ok {
					r.findings[p] = append(r.findings[p], fmt.Sprintf("the erasures did not hold again within %s of the restore: %s", restoreHoldBound, r.notHeldReport(ctx, e, db, p)))
				}
			}
			return time.Time{}, nil
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// waitIntact waits until every run's store reports ErasuresIntact True at a
// moment more than one audit interval after the erasures held (so that an
// audit ran on the database as the re-erasure left it), within the bound.
func (r *restoreFault) waitIntact(ctx context.Context, e *env, api *apiRecorder, db *database, plans []*runPlan, heldAt time.Time) error {
	earliest := heldAt.Add(storeRecheck + 2*time.Second)
	deadline := time.Now().Add(restoreHoldBound)
	if heldAt.IsZero() {
		earliest, deadline = time.Now(), time.Now().Add(storeRecheck+2*time.Second)
	}
	for {
		if err := api.err(); err != nil {
			return err
		}
		intact := map[*runPlan]string{}
		for _, p := range plans {
			c, seen := api.storeIntact(p)
			if seen {
				r.detected[p] = true
			}
			if not := notIntact(c); not != "" {
				intact[p] = not
			}
		}
		if len(intact) == 0 && time.Now().After(earliest) {
			// The watch may lag behind: the API server confirms.
			var err error
			if intact, err = storesNotIntact(ctx, e, plans); err != nil || len(intact) == 0 {
				return err
			}
		}
		if time.Now().After(deadline) {
			for p, c := range intact {
				r.findings[p] = append(r.findings[p], fmt.Sprintf("the store's ErasuresIntact is %s, not True, %s after the restore; the ledger holds %s; %s",
					c, time.Since(r.at).Round(time.Second), ledgerSummary(ctx, db, p, r.atRestore[p], r.deletedObject(p)), r.notHeldReport(ctx, e, db, p)))
			}
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// record is what the run's checks need of the restore.
func (r *restoreFault) record(p *runPlan, after []dbEffect) *restoreRecord {
	rec := &restoreRecord{AtRestore: r.atRestore[p], EffectsAfter: after, Findings: r.findings[p]}
	if r.deletedRun == p {
		rec.Deleted = r.deleted.Name
	}
	return rec
}

// storesNotIntact reads each run's store from the API server and says, of
// each whose ErasuresIntact is not True, what it is.
func storesNotIntact(ctx context.Context, e *env, plans []*runPlan) (map[*runPlan]string, error) {
	out := map[*runPlan]string{}
	for _, p := range plans {
		store := &lethev1.MemoryStore{}
		if err := e.k8s.Get(ctx, keyOf(p.NS, "memory"), store); err != nil {
			return nil, err
		}
		if not := notIntact(meta.FindStatusCondition(store.Status.Conditions, lethev1.MemoryStoreErasuresIntact)); not != "" {
			out[p] = not
		}
	}
	return out, nil
}

// notIntact says what a store's ErasuresIntact condition c is when it is
// not True ("absent" for none), "" when it is.
func notIntact(c *metav1.Condition) string {
	switch {
	case c == nil:
		return "absent"
	case c.Status != metav1.ConditionTrue:
		return string(c.Status) + "/" + c.Reason
	}
	return ""
}

// ledgerSummary says, for a report, how many session rows each request of
// the run holds erased in the ledger, and how many sessions it found.
func ledgerSummary(ctx context.Context, db *database, p *runPlan, states map[string]*lethev1.ErasureRequest, deletedObj *lethev1.ErasureRequest) string {
	var parts []string
	for _, r := range p.Requests {
		var n int64
		err := db.do(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, `SELECT count(*) FROM lethe.erasure_ledger WHERE request_uid = $1 AND scope = 'session' AND erased_at IS NOT NULL`, r.UID).Scan(&n)
		})
		if err != nil {
			return err.Error()
		}
		var found int32
		if er := states[r.Name]; er != nil && er.Status.Plan != nil {
			found = er.Status.Plan.SessionsFound
		}
		deleted := ""
		if deletedObj != nil && deletedObj.Name == r.Name {
			deleted = ", object deleted"
		}
		parts = append(parts, fmt.Sprintf("%s: %d of %d found sessions erased (%s%s)", r.Name, n, found, states[r.Name].Status.Phase, deleted))
	}
	return strings.Join(parts, "; ")
}
