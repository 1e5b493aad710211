package connector

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// The MemoryStore controller's checks: whether the store's layers answer,
// its schema's audit, and the graph sweep.

// CheckPostgres connects to the primary and every replica, each bounded by
// timeout; nil when all answered. A missing Secret is a *erasure.ConfigError.
func (c *Connector) CheckPostgres(ctx context.Context, store *lethev1.MemoryStore, timeout time.Duration) error {
	targets := map[string]lethev1.SecretKeyRef{"primary": store.Spec.Postgres.DSNSecretRef}
	names := []string{"primary"}
	for i, rep := range store.Spec.Postgres.Replicas {
		name := fmt.Sprintf("replica %d", i)
		targets[name] = rep.DSNSecretRef
		names = append(names, name)
	}
	for _, name := range names {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := c.ping(pctx, store, name, targets[name])
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Connector) ping(ctx context.Context, store *lethev1.MemoryStore, target string, ref lethev1.SecretKeyRef) error {
	db, err := c.pool(ctx, store, target, ref)
	if err != nil {
		return prefixed(target, err)
	}
	if err := db.Ping(ctx); err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	return nil
}

// AuditSchema runs the decision record's validation queries on the primary.
func (c *Connector) AuditSchema(ctx context.Context, store *lethev1.MemoryStore) (postgres.SchemaReport, error) {
	db, err := c.pool(ctx, store, "primary", store.Spec.Postgres.DSNSecretRef)
	if err != nil {
		return postgres.SchemaReport{}, err
	}
	return postgres.AuditSchema(ctx, db, store.Spec.Postgres.SchemaOrDefault())
}

// AuditRedaction checks the store's redacted columns for their trigger and
// samples at most sample values of each (postgres.AuditRedaction).
func (c *Connector) AuditRedaction(ctx context.Context, store *lethev1.MemoryStore, sample int) ([]postgres.RedactedColumn, error) {
	db, err := c.pool(ctx, store, "primary", store.Spec.Postgres.DSNSecretRef)
	if err != nil {
		return nil, err
	}
	scope := postgres.SampleScope{Sessions: postgres.Table{Schema: store.Spec.Postgres.SchemaOrDefault(), Name: "sessions"}, TenantID: store.Spec.TenantID}
	return postgres.AuditRedaction(ctx, db, store.Spec.Postgres.RedactedColumnsOrDefault(), sample, scope)
}

// AuditParameterLogging reads how the server logs the parameters of the
// manager's statements (postgres.AuditParameterLogging), in a new session
// and in every idle session of the store's pool: a setting given to a role
// or a database reaches only sessions that start after it. When a new
// session would not log them but a pooled one does, or the new session
// reads differently from the last audit's (a connection in use then may
// predate the change), the pool is reset: its connections are replaced by
// ones with the settings now (those in use close when released); never
// towards logging. A reading that logs wins: the pooled one, the new one,
// or, right after a reset, the last audit's; the condition turns True only
// at the audit after the pool was replaced. The new session is opened
// beside the pool's MaxConns.
func (c *Connector) AuditParameterLogging(ctx context.Context, store *lethev1.MemoryStore) (postgres.ParameterLogging, error) {
	db, err := c.pool(ctx, store, "primary", store.Spec.Postgres.DSNSecretRef)
	if err != nil {
		return postgres.ParameterLogging{}, err
	}
	pooled, err := idleParameterLogging(ctx, db)
	if err != nil {
		return postgres.ParameterLogging{}, err
	}
	logging := slices.IndexFunc(pooled, func(p postgres.ParameterLogging) bool { return !p.Unlogged() })
	fresh, err := newSessionParameterLogging(ctx, db)
	switch {
	case err != nil && logging >= 0:
		return pooled[logging], nil // a known leak stays reported
	case err != nil:
		return fresh, err
	}
	key := cacheKey(store, "primary")
	prev, seen := c.paramLogs.Swap(key, fresh)
	last, _ := prev.(postgres.ParameterLogging)
	stale := seen && !fresh.Same(last) ||
		slices.ContainsFunc(pooled, func(p postgres.ParameterLogging) bool { return !p.Same(fresh) })
	if stale && fresh.Unlogged() {
		db.Reset()
	}
	switch {
	case logging >= 0:
		return pooled[logging], nil
	case !fresh.Unlogged():
		return fresh, nil
	case seen && stale && !last.Unlogged():
		return last, nil
	}
	return fresh, nil
}

// idleParameterLogging reads the settings in every idle session of db.
func idleParameterLogging(ctx context.Context, db *pgxpool.Pool) ([]postgres.ParameterLogging, error) {
	conns := db.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	out := make([]postgres.ParameterLogging, 0, len(conns))
	for _, c := range conns {
		p, err := postgres.AuditParameterLogging(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// newSessionParameterLogging reads the settings in a session of its own,
// with the pool's connection settings.
func newSessionParameterLogging(ctx context.Context, db *pgxpool.Pool) (postgres.ParameterLogging, error) {
	conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig.Copy())
	if err != nil {
		return postgres.ParameterLogging{}, fmt.Errorf("open a new session to read its logging settings: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return postgres.AuditParameterLogging(ctx, conn)
}

// maxPersonNames bounds the names one audit reads from the graph.
const maxPersonNames = 100000

// SyncPersonNames makes the names dictionary's graph-fed part the names of
// the graph's person entities (spec.falkorDB.personLabel); nothing when
// the store names no person label. It returns how many names the
// dictionary then holds from the graph.
func (c *Connector) SyncPersonNames(ctx context.Context, store *lethev1.MemoryStore) (int64, error) {
	if store.Spec.FalkorDB == nil || store.Spec.FalkorDB.PersonLabel == "" {
		return 0, nil
	}
	g, err := c.Graph(ctx, store)
	if err != nil {
		return 0, err
	}
	names, err := g.PersonNames(ctx, store.Spec.FalkorDB.PersonLabel, maxPersonNames)
	if err != nil {
		return 0, err
	}
	db, err := c.pool(ctx, store, "primary", store.Spec.Postgres.DSNSecretRef)
	if err != nil {
		return 0, err
	}
	_, _, kept, err := postgres.SyncGraphNames(ctx, db, names)
	return kept, err
}

// CheckGraph pings FalkorDB (bounded by pingTimeout) and makes sure the
// provenance indexes exist (bounded by indexTimeout: building them on a
// large graph takes seconds; only the first check per client builds them).
func (c *Connector) CheckGraph(ctx context.Context, store *lethev1.MemoryStore, pingTimeout, indexTimeout time.Duration) error {
	g, err := c.Graph(ctx, store)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := g.Ping(pctx); err != nil {
		return err
	}
	ictx, icancel := context.WithTimeout(ctx, indexTimeout)
	defer icancel()
	if err := g.EnsureIndexes(ictx); err != nil {
		return fmt.Errorf("the provenance indexes could not be created: %w", err)
	}
	return nil
}

// Sweep reconciles the store's whole graph from Postgres.
func (c *Connector) Sweep(ctx context.Context, store *lethev1.MemoryStore, opts graph.SweepOptions) (graph.SweepResult, error) {
	g, err := c.Graph(ctx, store)
	if err != nil {
		return graph.SweepResult{}, err
	}
	db, err := c.pool(ctx, store, "primary", store.Spec.Postgres.DSNSecretRef)
	if err != nil {
		return graph.SweepResult{}, err
	}
	return g.Sweep(ctx, postgres.GraphSource{Pool: db, Schema: store.Spec.Postgres.SchemaOrDefault()}, opts)
}

// CheckErasures reports the requests whose erasures the store's database no
// longer holds (reqs: what each request found and erased).
func (c *Connector) CheckErasures(ctx context.Context, store *lethev1.MemoryStore, reqs []erasure.Request) ([]erasure.RestoreFinding, error) {
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return nil, err
	}
	return ledger.Intact(ctx, reqs)
}

// PruneGoneErasures prunes from the store's graph what it holds of the
// sessions erased since since by requests whose object is gone (live: the
// UIDs of the requests that remain, which re-verify their own erasure): a
// derivation job that committed after such a request's graph step would
// otherwise keep its elements until the next full sweep. Each chunk of
// sessions is counted through the provenance indexes first and pruned only
// when it holds something. It returns the sessions checked and what went.
func (c *Connector) PruneGoneErasures(ctx context.Context, store *lethev1.MemoryStore, live []string, since time.Time, chunk, limit int) (int, graph.Counts, error) {
	var removed graph.Counts
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return 0, removed, err
	}
	ids, err := ledger.ErasedSessionsOfGoneRequests(ctx, live, since)
	if err != nil || len(ids) == 0 {
		return 0, removed, err
	}
	g, err := c.Graph(ctx, store)
	if err != nil {
		return 0, removed, err
	}
	for part := range slices.Chunk(ids, chunk) {
		held, err := g.Count(ctx, part)
		if err != nil {
			return 0, removed, err
		}
		if held.Total() == 0 {
			continue
		}
		n, err := g.Prune(ctx, part, limit)
		if err != nil {
			return 0, removed, err
		}
		removed.Add(n)
	}
	return len(ids), removed, nil
}
