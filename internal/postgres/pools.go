package postgres

import (
	"context"
	"strings"
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
	memos sync.Map // key + "\x00" + schema -> *AuditMemo
}

// Memo is the audit memo shared by the Erasers of the schema of the pool
// under key (see AuditMemo); it is dropped with the pool's key.
func (p *Pools) Memo(key, schema string) *AuditMemo {
	m, _ := p.memos.LoadOrStore(key+"\x00"+schema, &AuditMemo{vacuums: vacuumQueue{gap: p.Options.VacuumGap}})
	return m.(*AuditMemo)
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
func (p *Pools) ForgetPrefix(prefix string) {
	p.pools().ForgetPrefix(prefix)
	p.memos.Range(func(k, _ any) bool {
		if strings.HasPrefix(k.(string), prefix) {
			p.memos.Delete(k)
		}
		return true
	})
}

// Close closes every pool.
func (p *Pools) Close() { p.pools().Close() }
