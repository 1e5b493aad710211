package graph

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The graph model of memory-schema.md: every node and relationship carries
// its provenance as application IDs from Postgres.
const (
	// LabelSession nodes are keyed by the session's id.
	LabelSession = "Session"
	// LabelFact nodes are keyed by the fact's id and carry session_id.
	LabelFact = "Fact"
	// LabelEntity nodes have no provenance of their own: they live as long
	// as a relationship with surviving provenance touches them.
	LabelEntity = "Entity"

	propID        = "id"
	propSessionID = "session_id"
	propFactID    = "fact_id"
	propKey       = "key"
)

// layout is the labels and relationship types present in the graph.
type layout struct {
	// sessionLabels are the labels pruned by session_id: all but Session and Entity.
	sessionLabels []string
	relTypes      []string
	hasSession    bool
	hasEntity     bool
	hasFact       bool
}

// readLayout lists the labels and relationship types. Names that are not
// plain identifiers are refused: Lethe never quotes graph-supplied text
// into a query, and skipping them would leave data behind.
func (g *Graph) readLayout(ctx context.Context) (layout, error) {
	var l layout
	labels, err := g.names(ctx, "CALL db.labels() YIELD label RETURN label")
	if err != nil {
		if strings.Contains(err.Error(), "empty key") {
			// No graph under this key (yet): nothing derived, nothing to do.
			return l, nil
		}
		return l, err
	}
	for _, lb := range labels {
		switch lb {
		case LabelSession:
			l.hasSession = true
		case LabelEntity:
			l.hasEntity = true
		default:
			if lb == LabelFact {
				l.hasFact = true
			}
			l.sessionLabels = append(l.sessionLabels, lb)
		}
	}
	if l.relTypes, err = g.names(ctx, "CALL db.relationshipTypes() YIELD relationshipType RETURN relationshipType"); err != nil {
		return l, err
	}
	if err := g.ensureIndexes(ctx, l); err != nil {
		return l, err
	}
	return l, g.waitForIndexes(ctx)
}

// waitForIndexes returns once no index of the graph is still being built.
// FalkorDB builds an index on existing data in the background, and deleting
// nodes while it does so corrupted the graph in our runs (a later read of
// the label failed with "Attempted to access undefined attribute" and a
// further one crashed the server). So Lethe never deletes while an index,
// its own or anyone's, is under construction.
func (g *Graph) waitForIndexes(ctx context.Context) error {
	for {
		n, err := g.count(ctx, "CALL db.indexes() YIELD status WHERE status <> 'OPERATIONAL' RETURN count(status)", nil)
		if err != nil || n == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d index(es) of graph %s still under construction: %w", n, g.name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// EnsureIndexes creates the provenance indexes Lethe queries by and waits
// until they are built. The MemoryStore controller calls it when it checks
// the graph, so that they exist before the first erasure.
func (g *Graph) EnsureIndexes(ctx context.Context) error {
	_, err := g.readLayout(ctx)
	return err
}

func (g *Graph) names(ctx context.Context, q string) ([]string, error) {
	res, err := g.ReadQuery(ctx, q, nil)
	if err != nil {
		return nil, err
	}
	var out []string
	cells, err := column(res)
	if err != nil {
		return nil, err
	}
	for _, v := range cells {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%s returned %T", q, v)
		}
		if _, err := quoteName(s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out, nil
}

// ensureIndexes indexes every provenance property Lethe queries by, so that
// the targeted step reads only the erased sessions' elements. FalkorDB has no
// CREATE INDEX IF NOT EXISTS: "already indexed" counts as done. Indexes
// known to exist are remembered per client.
func (g *Graph) ensureIndexes(ctx context.Context, l layout) error {
	type want struct{ pattern, prop string }
	var ws []want
	if l.hasSession {
		ws = append(ws, want{"(n:`" + LabelSession + "`)", propID})
	}
	if l.hasFact {
		ws = append(ws, want{"(n:`" + LabelFact + "`)", propID})
	}
	if l.hasEntity {
		ws = append(ws, want{"(n:`" + LabelEntity + "`)", propKey})
	}
	for _, lb := range l.sessionLabels {
		ws = append(ws, want{"(n:`" + lb + "`)", propSessionID})
	}
	for _, t := range l.relTypes {
		ws = append(ws, want{"()-[n:`" + t + "`]-()", propSessionID}, want{"()-[n:`" + t + "`]-()", propFactID})
	}
	for _, w := range ws {
		key := g.name + "\x00" + w.pattern + "\x00" + w.prop
		if _, ok := g.c.indexed.Load(key); ok {
			continue
		}
		_, err := g.Query(ctx, "CREATE INDEX FOR "+w.pattern+" ON (n."+w.prop+")", nil)
		if err != nil && !strings.Contains(err.Error(), "already indexed") {
			return fmt.Errorf("index %s.%s: %w", w.pattern, w.prop, err)
		}
		g.c.indexed.Store(key, true)
	}
	return nil
}
