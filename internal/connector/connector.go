// Package connector turns a MemoryStore into the connections Lethe works
// through: it reads the store's Secrets (in the store's namespace only,
// each value held for SecretTTL at most), keeps one pool per database and one client per graph, and hands
// the phase machine its ports. Both controllers use it; neither sees a
// client library.
package connector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// Connector opens a store's connections. Connections are cached per store
// and target and reopened when a Secret's value changes.
type Connector struct {
	// Secrets reads Secrets straight from the API server (the manager's
	// API reader: Lethe keeps no Secret cache).
	Secrets client.Reader
	Pools   *postgres.Pools
	Graphs  *graph.Clients
	// Velero is the backups port of every store that configures Velero.
	Velero erasure.Backups
	// SecretTTL is how long a Secret value read is reused (secretValues);
	// zero: every read goes to the API server.
	SecretTTL time.Duration
	// Clock times SecretTTL; the real clock when nil.
	Clock clock.PassiveClock

	secrets secretValues
	// paramLogs is the last new session's postgres.ParameterLogging per
	// store pool (AuditParameterLogging).
	paramLogs sync.Map
}

// Ports returns the ports of one pass over store. The primary is opened
// at once (every step needs it); the graph and the replicas on first use.
func (c *Connector) Ports(ctx context.Context, store *lethev1.MemoryStore) (erasure.Ports, error) {
	if store.Spec.Velero != nil && c.Velero == nil {
		return erasure.Ports{}, errors.New("the store configures Velero but the connector has no Velero port")
	}
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return erasure.Ports{}, err
	}
	p := erasure.Ports{Ledger: ledger, Replicas: &lazyReplicas{c: c, store: store}}
	if store.Spec.FalkorDB != nil {
		p.Graph = &lazyGraph{c: c, store: store}
	}
	if store.Spec.Velero != nil {
		p.Backups = c.Velero
	}
	return p, nil
}

// Ledger opens the store's primary as the erasure ledger.
func (c *Connector) Ledger(ctx context.Context, store *lethev1.MemoryStore) (*postgres.Eraser, error) {
	pool, err := c.pool(ctx, store, "primary", store.Spec.Postgres.DSNSecretRef)
	if err != nil {
		return nil, err
	}
	schema := store.Spec.Postgres.SchemaOrDefault()
	return &postgres.Eraser{Pool: pool, Schema: schema, TenantID: store.Spec.TenantID,
		ProbeExclude: store.Spec.Postgres.ResidueProbeExclude, Memo: c.Pools.Memo(cacheKey(store, "primary"), schema)}, nil
}

// Graph opens the store's graph.
func (c *Connector) Graph(ctx context.Context, store *lethev1.MemoryStore) (*graph.Graph, error) {
	url, err := c.ReadSecretKey(ctx, store.Namespace, store.Spec.FalkorDB.URLSecretRef)
	if err != nil {
		return nil, err
	}
	cl, err := c.Graphs.Get(cacheKey(store, "graph"), url)
	if err != nil {
		return nil, &erasure.ConfigError{Reason: lethev1.ReasonInvalidSecret, Message: err.Error()}
	}
	return cl.Graph(store.Spec.FalkorDB.GraphOrDefault()), nil
}

// Forget closes and drops the cached connections of a deleted store.
func (c *Connector) Forget(key types.NamespacedName) {
	c.Pools.ForgetPrefix(key.String() + "/")
	c.Graphs.Forget(key.String() + "/graph")
	c.paramLogs.Delete(key.String() + "/primary")
}

// pool opens (or reuses) the pool of one target of the store.
func (c *Connector) pool(ctx context.Context, store *lethev1.MemoryStore, target string, ref lethev1.SecretKeyRef) (*pgxpool.Pool, error) {
	dsn, err := c.ReadSecretKey(ctx, store.Namespace, ref)
	if err != nil {
		return nil, err
	}
	pool, err := c.Pools.Get(ctx, cacheKey(store, target), dsn)
	if errors.Is(err, postgres.ErrInvalidDSN) {
		return nil, &erasure.ConfigError{Reason: lethev1.ReasonInvalidSecret,
			Message: fmt.Sprintf("%s: Secret %s/%s key %q: %v", target, store.Namespace, ref.Name, ref.Key, err)}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", target, err)
	}
	return pool, nil
}

// ReadSecretKey reads one key of a Secret in namespace, reusing a value
// read within SecretTTL. A missing Secret or key is a *erasure.ConfigError;
// the value is never logged or put in a message.
func (c *Connector) ReadSecretKey(ctx context.Context, namespace string, ref lethev1.SecretKeyRef) (string, error) {
	k := secretKey{namespace: namespace, name: ref.Name, key: ref.Key}
	if c.SecretTTL <= 0 {
		return c.readSecretKey(ctx, k)
	}
	now := c.now()
	if v, ok := c.secrets.get(k, now); ok {
		return v, nil
	}
	v, err := c.readSecretKey(ctx, k)
	if err == nil {
		c.secrets.put(k, v, now, c.SecretTTL)
	}
	return v, err
}

func (c *Connector) now() time.Time {
	if c.Clock == nil {
		return time.Now()
	}
	return c.Clock.Now()
}

// readSecretKey reads one key of a Secret from the API server.
func (c *Connector) readSecretKey(ctx context.Context, k secretKey) (string, error) {
	namespace, ref := k.namespace, lethev1.SecretKeyRef{Name: k.name, Key: k.key}
	secret := &corev1.Secret{}
	err := c.Secrets.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, secret)
	switch {
	case apierrors.IsNotFound(err):
		return "", &erasure.ConfigError{Reason: lethev1.ReasonSecretNotFound, Message: fmt.Sprintf("Secret %s/%s not found", namespace, ref.Name)}
	case apierrors.IsForbidden(err):
		return "", &erasure.ConfigError{Reason: lethev1.ReasonSecretNotFound,
			Message: fmt.Sprintf("the manager may not read Secret %s/%s (RBAC)", namespace, ref.Name)}
	case err != nil:
		// The API server is unreachable or failing: an outage, not a configuration.
		return "", fmt.Errorf("read Secret %s/%s: %w", namespace, ref.Name, err)
	}
	v, ok := secret.Data[ref.Key]
	if !ok || len(v) == 0 {
		return "", &erasure.ConfigError{Reason: lethev1.ReasonSecretKeyMissing, Message: fmt.Sprintf("Secret %s/%s has no key %q", namespace, ref.Name, ref.Key)}
	}
	return string(v), nil
}

// cacheKey names a cached connection by store and target.
func cacheKey(store *lethev1.MemoryStore, target string) string {
	return store.Namespace + "/" + store.Name + "/" + target
}

// prefixed names the target in a configuration error's message.
func prefixed(target string, err error) error {
	var ce *erasure.ConfigError
	if errors.As(err, &ce) {
		return &erasure.ConfigError{Reason: ce.Reason, Message: target + ": " + ce.Message}
	}
	return err
}
