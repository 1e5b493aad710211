package postgres

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lethe-dev/lethe/internal/conncache"
)

// Pools keeps one connection pool per key (e.g. a MemoryStore's UID and
// role), so reconciles reuse connections instead of dialling each time. A
// changed DSN (a rotated Secret) replaces the pool. The zero value, with
// Options set, is ready to use; Options must not change after the first Get.
type Pools struct {
	Options Options

	once  sync.Once
	cache *conncache.Cache[*pgxpool.Pool]
}

func (p *Pools) pools() *conncache.Cache[*pgxpool.Pool] {
	p.once.Do(func() {
		opts := p.Options
		p.cache = conncache.New(
			func(ctx context.Context, dsn string) (*pgxpool.Pool, error) { return Connect(ctx, dsn, opts) },
			(*pgxpool.Pool).Close,
		)
	})
	return p.cache
}

// Get returns the pool for key, opening it (or reopening it when dsn changed).
func (p *Pools) Get(ctx context.Context, key, dsn string) (*pgxpool.Pool, error) {
	return p.pools().Get(ctx, key, dsn)
}

// ForgetPrefix closes and drops every pool whose key starts with prefix (a
// deleted store's primary and replicas).
func (p *Pools) ForgetPrefix(prefix string) { p.pools().ForgetPrefix(prefix) }

// Close closes every pool.
func (p *Pools) Close() { p.pools().Close() }
