// Package graph is Lethe's adapter to FalkorDB, the knowledge graph derived
// from the memory. It wraps falkordb-go around its known traps: go-redis's
// read timeout plus retries can re-run a write, so retries are off and every
// call is bounded by its context instead.
package graph

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/FalkorDB/falkordb-go/v2"
	"github.com/redis/go-redis/v9"

	"github.com/lethe-dev/lethe/internal/conncache"
)

// quiet keeps go-redis from printing dial errors to stderr: every error is
// returned to the caller, which reports it as a condition.
var quiet sync.Once

type discard struct{}

func (discard) Printf(context.Context, string, ...interface{}) {}

var errBadURL = errors.New("invalid FalkorDB URL: want falkor://[user:password@]host:port")

// Client talks to one FalkorDB server.
type Client struct {
	db   *falkordb.FalkorDB
	host string // host:port, naming the server's graphs for pruneLock
	// indexed remembers the provenance indexes known to exist.
	indexed sync.Map
	// subqueriesChecked: the server was seen to run a CALL subquery once
	// per row (checkSubqueries).
	subqueriesChecked atomic.Bool
}

// Open parses a falkor://[user:pass@]host:port URL (redis:// is accepted too)
// and returns a client. It does not connect yet.
func Open(rawURL string) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil || u.Host == "" {
		// Never echo the URL: it may hold a password.
		return nil, errBadURL
	}
	switch u.Scheme {
	case "falkor", "redis":
		u.Scheme = "redis"
	case "falkors", "rediss":
		u.Scheme = "rediss"
	default:
		return nil, errBadURL
	}
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, errBadURL
	}
	quiet.Do(func() { redis.SetLogger(discard{}) })
	// A timed-out read must not be retried: the write may already have run.
	opts.ReadTimeout = -1
	opts.MaxRetries = -1
	opts.ContextTimeoutEnabled = true
	db, err := falkordb.FalkorDBNew(opts)
	if err != nil {
		return nil, fmt.Errorf("open FalkorDB client: %w", err)
	}
	return &Client{db: db, host: u.Host}, nil
}

// Ping checks that the server answers and has the graph module loaded.
func (c *Client) Ping(ctx context.Context) error {
	if err := c.db.Conn.Do(ctx, "GRAPH.LIST").Err(); err != nil {
		return fmt.Errorf("FalkorDB does not answer GRAPH.LIST: %w", err)
	}
	return nil
}

// Close releases the connections.
func (c *Client) Close() error { return c.db.Conn.Close() }

// Clients keeps one Client per key (e.g. a MemoryStore's UID), reopening it
// when the URL changes (a rotated Secret). The zero value is ready to use.
type Clients struct {
	once  sync.Once
	cache *conncache.Cache[*Client]
}

func (c *Clients) clients() *conncache.Cache[*Client] {
	c.once.Do(func() {
		c.cache = conncache.New(
			func(_ context.Context, rawURL string) (*Client, error) { return Open(rawURL) },
			func(cl *Client) { _ = cl.Close() },
		)
	})
	return c.cache
}

// Get returns the client for key, opening it when missing or when url changed.
func (c *Clients) Get(key, rawURL string) (*Client, error) {
	// Open does not connect: nothing here waits on the network.
	return c.clients().Get(context.Background(), key, rawURL)
}

// Forget closes and drops the client for key.
func (c *Clients) Forget(key string) { c.clients().Forget(key) }

// Close closes every client.
func (c *Clients) Close() { c.clients().Close() }
