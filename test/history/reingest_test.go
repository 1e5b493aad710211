package history

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Re-ingestion: the memory system keeps the raw transcript files, and its
// backfill may ingest one again, under a new session ID, at any moment —
// also after the session it once made was erased, and after a restore. The
// ledger must refuse a transcript whose session a request holds erased
// (SQLSTATE LE002) and let any other through.

// reingestion is one attempt, as the backfill makes it: as the application
// role, a new session ID, the run's tenant, the source_path of one of the
// run's sessions.
type reingestion struct {
	Session string // the run's session whose transcript was ingested again
	// Hash is the keyed hash of the path, as the refusal trigger computes it.
	Hash string
	// Snapshot is the one the insert read the ledger with: the attempt runs
	// at REPEATABLE READ, so the trigger's ledger read sees exactly the
	// transactions the snapshot shows committed. The checker decides from
	// the recorded ledger effects what the trigger had to decide: no window.
	Snapshot pgSnapshot
	Refused  bool
	// AfterRestore: the attempt read the restored database.
	AfterRestore bool
	// Final: made once the run's erasures hold (its requests done; after a
	// restore, erased again).
	Final bool
}

// pgSnapshot is a PostgreSQL snapshot (pg_current_snapshot).
type pgSnapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

// parseSnapshot reads pg_snapshot's text form, xmin:xmax:xip,xip,...
func parseSnapshot(s string) (pgSnapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return pgSnapshot{}, fmt.Errorf("snapshot %q", s)
	}
	var snap pgSnapshot
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snap, err
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snap, err
	}
	for _, x := range strings.Split(parts[2], ",") {
		if x == "" {
			continue
		}
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return snap, err
		}
		snap.xip = append(snap.xip, v)
	}
	return snap, nil
}

// visible says whether the snapshot sees the transaction txid's effects as
// committed (pg_visible_in_snapshot; a recorded effect comes from a
// transaction that committed, the recorder writing in it).
func (s pgSnapshot) visible(txid int64) bool {
	x := uint64(txid)
	return x < s.xmin || x < s.xmax && !slices.Contains(s.xip, x)
}

// reingestLog collects the attempts of a round, per run.
type reingestLog struct {
	mu    sync.Mutex
	byRun map[int][]reingestion
}

func (l *reingestLog) add(run int, a reingestion) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byRun == nil {
		l.byRun = map[int][]reingestion{}
	}
	l.byRun[run] = append(l.byRun[run], a)
}

func (l *reingestLog) of(run int) []reingestion {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.byRun[run])
}

// reingest makes one attempt. An ingested copy is deleted at once, by the
// superuser: the run's checks count its own session IDs, and the copy's is new.
func reingest(db *database, p *runPlan, session string, final bool) (reingestion, error) {
	// Not under the round's context: pgx closes a connection whose query's
	// context is cancelled.
	a := reingestion{Session: session, Final: final}
	path := "raw-jsonl/" + session + ".jsonl" // the fixture's transcript path
	err := db.within(20*time.Second, func(ctx context.Context, conn *pgx.Conn) error {
		a.AfterRestore = db.restored
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var snap, id string
		if err := tx.QueryRow(ctx, `SELECT pg_current_snapshot()::text, lethe.source_hash($1), gen_random_uuid()::text`, path).Scan(&snap, &a.Hash, &id); err != nil {
			return err
		}
		if a.Snapshot, err = parseSnapshot(snap); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE memory_app`); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO memory.sessions (id, tenant_id, source_path, started_at) VALUES ($1, $2, $3, now())`, id, p.Tenant, path)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "LE002" {
			a.Refused = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("re-ingest a transcript of run %d: %w", p.ID, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `DELETE FROM memory.sessions WHERE id = $1`, id)
		return err
	})
	return a, err
}

// reingestAtRandom makes attempts at random moments, for a random run and a
// random one of its sessions (a requested one of the tenant, the one never
// requested, the other tenant's a request named), until ctx ends.
func reingestAtRandom(ctx context.Context, db *database, plans []*runPlan, log *reingestLog, f *faults, rng *rand.Rand) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Duration(100+rng.IntN(1400)) * time.Millisecond):
		}
		p := plans[rng.IntN(len(plans))]
		candidates := append(slices.Clone(p.Own), p.Foreign)
		a, err := reingest(db, p, candidates[rng.IntN(len(candidates))], false)
		if err != nil {
			return err
		}
		log.add(p.ID, a)
		f.countReingestion(a)
	}
}

// reingestFinal makes, once the erasures hold, one attempt per run for a
// session its requests erased (if any) and one for a session they did not.
func reingestFinal(db *database, plans []*runPlan, states map[*runPlan]map[string]*lethev1.ErasureRequest, log *reingestLog, f *faults, rng *rand.Rand) error {
	for _, p := range plans {
		erased := mustBeErased(p, states[p])
		var kept []string
		for _, s := range append(slices.Clone(p.Own), p.Foreign) {
			if !slices.Contains(erased, s) {
				kept = append(kept, s)
			}
		}
		for _, set := range [][]string{erased, kept} {
			if len(set) == 0 {
				continue
			}
			a, err := reingest(db, p, set[rng.IntN(len(set))], true)
			if err != nil {
				return err
			}
			log.add(p.ID, a)
			f.countReingestion(a)
		}
	}
	return nil
}
