package postgres

import (
	"context"
	"strings"
	"testing"

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
