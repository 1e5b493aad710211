package postgres

import (
	"context"
	"crypto/sha256"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pools keeps one connection pool per key (e.g. a MemoryStore's UID and
// role), so reconciles reuse connections instead of dialling each time. A
// changed DSN (a rotated Secret) replaces the pool.
type Pools struct {
	Options Options

	mu    sync.Mutex
	pools map[string]pooled
}

type pooled struct {
	dsnHash [32]byte
	pool    *pgxpool.Pool
}

// Get returns the pool for key, opening it (or reopening it when dsn changed).
func (p *Pools) Get(ctx context.Context, key, dsn string) (*pgxpool.Pool, error) {
	h := sha256.Sum256([]byte(dsn))
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.pools[key]; ok {
		if cur.dsnHash == h {
			return cur.pool, nil
		}
		cur.pool.Close()
		delete(p.pools, key)
	}
	pool, err := Connect(ctx, dsn, p.Options)
	if err != nil {
		return nil, err
	}
	if p.pools == nil {
		p.pools = map[string]pooled{}
	}
	p.pools[key] = pooled{dsnHash: h, pool: pool}
	return pool, nil
}

// ForgetPrefix closes and drops every pool whose key starts with prefix (a
// deleted store's primary and replicas).
func (p *Pools) ForgetPrefix(prefix string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, cur := range p.pools {
		if strings.HasPrefix(k, prefix) {
			cur.pool.Close()
			delete(p.pools, k)
		}
	}
}

// Close closes every pool.
func (p *Pools) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, cur := range p.pools {
		cur.pool.Close()
		delete(p.pools, k)
	}
}
