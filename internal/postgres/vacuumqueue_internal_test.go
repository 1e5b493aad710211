package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// A vacuum that panics fails its waiters with an error and leaves the
// queue working: the next vacuum starts and returns.
func TestAPanickingVacuumFailsItsWaitersAndTheQueueGoesOn(t *testing.T) {
	ctx := context.Background()
	var q vacuumQueue
	_, err := q.run(ctx, nil, lethev1.VacuumLazy, func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error) {
		panic("boom")
	})
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a panicking vacuum returned %v, want an error saying it panicked", err)
	}
	res, err := q.run(ctx, nil, lethev1.VacuumLazy, func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error) {
		return erasure.VacuumResult{Vacuumed: 3}, nil
	})
	if err != nil || res.Vacuumed != 3 || q.Started() != 2 {
		t.Fatalf("the next vacuum: %+v, %v, %d started; want 3 tables, no error, 2 started", res, err, q.Started())
	}
}

// join returns at once: a deletion that committed while a vacuum ran joins
// the next one (which starts after the join), not the running one, and its
// done closes only when that next vacuum has ended, with its result.
func TestJoinReturnsAtOnceAndEndsWithTheNextVacuum(t *testing.T) {
	ctx := context.Background()
	var q vacuumQueue
	release := make(chan struct{})
	calls := 0
	vacuum := func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error) {
		calls++
		<-release
		return erasure.VacuumResult{Vacuumed: calls}, nil
	}
	running := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	next := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	if running == next {
		t.Fatal("a join while a vacuum runs joined the running one: it may have started before the deletion committed")
	}
	release <- struct{}{}
	<-running.done
	select {
	case <-next.done:
		t.Fatal("the next vacuum's done closed before it ran")
	default:
	}
	joined := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	release <- struct{}{}
	<-next.done
	if next.res.Vacuumed != 2 || next.err != nil {
		t.Fatalf("next vacuum: %+v, %v; want the second vacuum's result", next.res, next.err)
	}
	release <- struct{}{}
	<-joined.done
	if q.Started() != 3 {
		t.Fatalf("%d vacuums started, want 3", q.Started())
	}
}

// With a gap, the vacuum after one that just ended waits for it, counted
// from that end, not its start; every deletion finishing meanwhile joins
// that same vacuum, and one finishing once it started joins the next. A
// first vacuum starts at once.
func TestVacuumsOfABusyStoreAreSpacedByTheGap(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	q := vacuumQueue{gap: 10 * time.Second, clock: clk}
	release := make(chan struct{})
	vacuum := func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error) {
		<-release
		return erasure.VacuumResult{Vacuumed: 4}, nil
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (%d vacuums started)", what, q.Started())
			}
		}
	}
	end := func(r *vacuumRun) {
		t.Helper()
		select {
		case release <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatalf("the vacuum never ran (%d started)", q.Started())
		}
		<-r.done
	}
	first := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	until("the first vacuum did not start at once", func() bool { return q.Started() == 1 })
	clk.Step(20 * time.Second) // a long vacuum: the gap counts from its end
	end(first)

	next := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	until("the vacuum after the first does not wait for the gap", clk.HasWaiters)
	clk.Step(9 * time.Second)
	if joined := q.join(ctx, nil, lethev1.VacuumLazy, vacuum); joined != next {
		t.Fatal("a deletion finishing during the gap did not join the vacuum waiting for it")
	}
	if n := q.Started(); n != 1 {
		t.Fatalf("%d vacuums started 9 s after the first ended, want 1 (the gap is 10 s)", n)
	}
	clk.Step(time.Second)
	until("the second vacuum did not start once the gap was over", func() bool { return q.Started() == 2 })
	if later := q.join(ctx, nil, lethev1.VacuumLazy, vacuum); later == next {
		t.Fatal("a deletion finishing after the vacuum started joined it")
	}
	end(next)
	if next.waiters != 2 {
		t.Fatalf("%d deletions on the second vacuum, want 2", next.waiters)
	}
}

// A vacuum that vacuumed no table (the role may vacuum none of them) read
// no index: the next vacuum does not wait for the gap after it. One that
// vacuumed a table, or failed, is still followed by the gap.
func TestNoGapAfterAVacuumThatVacuumedNothing(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	q := vacuumQueue{gap: 10 * time.Second, clock: clk}
	result := make(chan erasure.VacuumResult)
	vacuum := func(context.Context, lethev1.VacuumMode) (erasure.VacuumResult, error) {
		return <-result, nil
	}
	end := func(r *vacuumRun, res erasure.VacuumResult) {
		t.Helper()
		select {
		case result <- res:
		case <-time.After(10 * time.Second):
			t.Fatalf("the vacuum never ran (%d started)", q.Started())
		}
		<-r.done
	}
	started := func(want int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); q.Started() != want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d vacuums started, want %d", q.Started(), want)
			}
		}
	}
	nothing := erasure.VacuumResult{NotPermitted: 6}
	first := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	started(1)
	end(first, nothing)
	// No step of the clock: the next vacuum must start at once.
	second := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	started(2)
	end(second, erasure.VacuumResult{Vacuumed: 1, NotPermitted: 5})
	third := q.join(ctx, nil, lethev1.VacuumLazy, vacuum)
	for deadline := time.Now().Add(10 * time.Second); !clk.HasWaiters(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the vacuum after one that vacuumed a table does not wait for the gap (%d started)", q.Started())
		}
	}
	if q.Started() != 2 {
		t.Fatalf("%d vacuums started right after one that vacuumed a table, want 2", q.Started())
	}
	clk.Step(10 * time.Second)
	started(3)
	end(third, nothing)
}
