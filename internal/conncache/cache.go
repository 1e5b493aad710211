// Package conncache keeps one connection (a pool, a client) per key and
// reopens it when the secret it was opened with changes. It holds a hash of
// each DSN, never the DSN itself.
package conncache

import (
	"context"
	"crypto/sha256"
	"strings"
	"sync"
)

// Cache keeps one T per key. It is safe for concurrent use. Opening happens
// under the cache's lock, so two Gets of one key open it once; closing
// happens after the lock is released, so a connection slow to drain blocks
// no other key.
type Cache[T any] struct {
	open  func(ctx context.Context, dsn string) (T, error)
	close func(T)

	mu      sync.Mutex
	entries map[string]entry[T]
}

type entry[T any] struct {
	dsnHash [sha256.Size]byte
	conn    T
}

// New returns an empty cache that opens with open and closes with close.
func New[T any](open func(ctx context.Context, dsn string) (T, error), close func(T)) *Cache[T] {
	return &Cache[T]{open: open, close: close, entries: map[string]entry[T]{}}
}

// Get returns the connection for key, opening it when missing and
// reopening it (closing the old one) when dsn differs from the one it was
// opened with. A failed open caches nothing and returns the error as is.
func (c *Cache[T]) Get(ctx context.Context, key, dsn string) (T, error) {
	h := sha256.Sum256([]byte(dsn))
	c.mu.Lock()
	cur, ok := c.entries[key]
	if ok && cur.dsnHash == h {
		c.mu.Unlock()
		return cur.conn, nil
	}
	delete(c.entries, key)
	conn, err := c.open(ctx, dsn)
	if err == nil {
		c.entries[key] = entry[T]{dsnHash: h, conn: conn}
	}
	c.mu.Unlock()
	if ok {
		c.close(cur.conn)
	}
	return conn, err
}

// Forget closes and drops the connection for key, if any.
func (c *Cache[T]) Forget(key string) {
	c.forget(func(k string) bool { return k == key })
}

// ForgetPrefix closes and drops every connection whose key starts with
// prefix (e.g. a deleted store's primary and replicas).
func (c *Cache[T]) ForgetPrefix(prefix string) {
	c.forget(func(k string) bool { return strings.HasPrefix(k, prefix) })
}

// Close closes and drops every connection. The cache stays usable: a later
// Get opens anew.
func (c *Cache[T]) Close() {
	c.forget(func(string) bool { return true })
}

func (c *Cache[T]) forget(match func(key string) bool) {
	var dropped []T
	c.mu.Lock()
	for k, cur := range c.entries {
		if match(k) {
			dropped = append(dropped, cur.conn)
			delete(c.entries, k)
		}
	}
	c.mu.Unlock()
	for _, conn := range dropped {
		c.close(conn)
	}
}

// Len is the number of connections held.
func (c *Cache[T]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
