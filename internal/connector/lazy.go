package connector

import (
	"context"
	"errors"
	"fmt"
	"sync"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// lazyGraph opens the store's graph on first use, so a pass that does not
// reach the graph step reads no Secret for it.
type lazyGraph struct {
	c     *Connector
	store *lethev1.MemoryStore
	once  sync.Once
	g     erasure.Graph
	err   error
}

func (l *lazyGraph) open(ctx context.Context) (erasure.Graph, error) {
	l.once.Do(func() {
		g, err := l.c.Graph(ctx, l.store)
		l.g, l.err = g, err
	})
	return l.g, l.err
}

func (l *lazyGraph) Name() string { return l.store.Spec.FalkorDB.GraphOrDefault() }

func (l *lazyGraph) Prune(ctx context.Context, ids []string, limit int) (erasure.GraphCounts, error) {
	g, err := l.open(ctx)
	if err != nil {
		return erasure.GraphCounts{}, err
	}
	return g.Prune(ctx, ids, limit)
}

func (l *lazyGraph) Count(ctx context.Context, ids []string) (erasure.GraphCounts, error) {
	g, err := l.open(ctx)
	if err != nil {
		return erasure.GraphCounts{}, err
	}
	return g.Count(ctx, ids)
}

// lazyReplicas opens the store's replicas on first use.
type lazyReplicas struct {
	c     *Connector
	store *lethev1.MemoryStore
}

func (l *lazyReplicas) CaughtUp(ctx context.Context, lsn string) (bool, error) {
	var reps postgres.Replicas
	for i, rep := range l.store.Spec.Postgres.Replicas {
		pool, err := l.c.pool(ctx, l.store, fmt.Sprintf("replica %d", i), rep.DSNSecretRef)
		if err != nil {
			return false, err
		}
		reps = append(reps, pool)
	}
	ok, err := reps.CaughtUp(ctx, lsn)
	if errors.Is(err, postgres.ErrNotReplica) {
		return false, &erasure.ConfigError{Reason: lethev1.ReasonInvalidSecret,
			Message: "a replica Secret names a server that is not a replica: " + err.Error()}
	}
	return ok, err
}
