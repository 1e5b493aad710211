package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// vacuumQueue coalesces the vacuums a store's deletions ask for. A vacuum
// that starts after a deletion committed removes that deletion's dead
// tuples (and index entries) just as one of its own would, so a deletion
// need not run its own: it joins the next vacuum of its mode that has not
// started yet. One vacuum runs at a time per store; while it runs, every
// deletion that finishes joins the same next one.
//
// The contract callers rely on: run returns the result of a vacuum that
// started after run was called.
//
// gap spaces the vacuums of a busy store: the next one starts no sooner
// than gap after the last one that vacuumed a table ended, and every
// deletion finishing in between joins it. Each vacuum reads every index of
// the tables whole (INDEX_CLEANUP ON), so back to back they cost a CPU for
// as long as deletions come; a first vacuum after a quiet gap starts at
// once, and so does one after a vacuum that vacuumed nothing (the role may
// vacuum none of the tables): it read no index, and waiting for it would
// only delay the deletions.
type vacuumQueue struct {
	mu      sync.Mutex
	running bool
	pending []*vacuumRun
	started int64 // vacuums started, for tests and benchmarks
	gap     time.Duration
	clock   clock.Clock // nil: the wall clock
	ended   time.Time   // when the last vacuum that vacuumed a table (or failed) ended
}

// vacuumRun is one vacuum and those waiting for it.
type vacuumRun struct {
	mode    lethev1.VacuumMode
	pool    DB // the database it vacuums: a rotated DSN may name another
	vacuum  func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error)
	done    chan struct{}
	waiters int // callers joined
	res     erasure.VacuumResult
	err     error
}

// run joins the next vacuum of mode on pool not yet started and waits for
// its result; ctx bounds only this caller's wait.
func (q *vacuumQueue) run(ctx context.Context, pool DB, mode lethev1.VacuumMode,
	vacuum func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error)) (erasure.VacuumResult, error) {
	return q.join(ctx, pool, mode, vacuum).wait(ctx)
}

// wait waits for the vacuum's result; ctx bounds only this wait.
func (r *vacuumRun) wait(ctx context.Context) (erasure.VacuumResult, error) {
	select {
	case <-r.done:
		return r.res, r.err
	case <-ctx.Done():
		return erasure.VacuumResult{}, ctx.Err()
	}
}

// join joins the next vacuum of mode on pool not yet started (or queues one
// that calls vacuum) and returns it: its done is closed when it has ended,
// res and err set before. The vacuum runs detached from ctx: others may be
// waiting for it.
func (q *vacuumQueue) join(ctx context.Context, pool DB, mode lethev1.VacuumMode,
	vacuum func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error)) *vacuumRun {
	q.mu.Lock()
	var r *vacuumRun
	for _, p := range q.pending {
		if p.mode == mode && p.pool == pool {
			r = p
		}
	}
	if r == nil {
		r = &vacuumRun{mode: mode, pool: pool, vacuum: vacuum, done: make(chan struct{})}
		q.pending = append(q.pending, r)
	}
	r.waiters++
	if !q.running {
		q.startLocked(context.WithoutCancel(ctx))
	}
	q.mu.Unlock()
	return r
}

// startLocked starts the first pending vacuum once gap has passed since
// the last one ended (it stays pending, open to joiners, until then), then
// the next one when it ends, until none is pending; q.mu is held.
func (q *vacuumQueue) startLocked(ctx context.Context) {
	q.running = true
	if wait := q.gap - q.now().Sub(q.ended); wait > 0 {
		go func() {
			<-q.clk().After(wait)
			q.mu.Lock()
			defer q.mu.Unlock()
			q.runLocked(ctx)
		}()
		return
	}
	q.runLocked(ctx)
}

// runLocked runs the first pending vacuum; q.mu is held.
func (q *vacuumQueue) runLocked(ctx context.Context) {
	r := q.pending[0]
	q.pending = q.pending[1:]
	q.started++
	go func() {
		// A panic would otherwise take the manager down and leave the
		// waiters, and every later vacuum of the store, waiting.
		defer func() {
			if p := recover(); p != nil {
				r.err = fmt.Errorf("the vacuum panicked: %v", p)
			}
			close(r.done)
			q.mu.Lock()
			defer q.mu.Unlock()
			q.running = false
			if r.err != nil || r.res.Vacuumed > 0 {
				q.ended = q.now()
			}
			if len(q.pending) > 0 {
				q.startLocked(ctx)
			}
		}()
		r.res, r.err = r.vacuum(ctx, r.mode)
	}()
}

func (q *vacuumQueue) clk() clock.Clock {
	if q.clock == nil {
		return clock.RealClock{}
	}
	return q.clock
}

func (q *vacuumQueue) now() time.Time { return q.clk().Now() }

// Started is how many vacuums the queue has started.
func (q *vacuumQueue) Started() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.started
}
