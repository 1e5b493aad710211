package graph

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/FalkorDB/falkordb-go/v2"
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
	var labels []string
	var building int64
	// One round trip: the names, whether an index is under construction,
	// and, until the server passed it once, the subquery check.
	err := g.readAll(ctx, nil,
		read{"CALL db.labels() YIELD label RETURN label", names(&labels)},
		read{"CALL db.relationshipTypes() YIELD relationshipType RETURN relationshipType", names(&l.relTypes)},
		read{indexesUnderConstruction, func(res *falkordb.QueryResult) (err error) { building, err = scalar(res); return err }},
		g.checkSubqueries())
	if err != nil {
		if strings.Contains(err.Error(), "empty key") {
			// No graph under this key (yet): nothing derived, nothing to do.
			return layout{}, nil
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
	created, err := g.ensureIndexes(ctx, l)
	if err != nil || (!created && building == 0) {
		return l, err
	}
	return l, g.waitForIndexes(ctx)
}

// subqueryCheck runs a CALL subquery shaped like anyRelationship's (an
// aggregation over a LIMIT) on two rows: each row must get its own
// subquery, giving 2. FalkorDB before 4.6.4 ran such a subquery once over
// all its input rows (its issue 938), so the LIMIT cut the whole stream to
// one row: every attestation check would have seen one entity and the
// prune would have left the others behind, reporting nothing left.
var subqueryCheck = "UNWIND [1, 2] AS x CALL { WITH x UNWIND [x, x] AS y WITH y LIMIT 1 RETURN count(y) AS n } RETURN toInteger(sum(n))"

// errSubqueries refuses a server that runs a CALL subquery once for all rows.
var errSubqueries = errors.New("this FalkorDB runs a CALL {} subquery once over all its input rows, not once per row (fixed in FalkorDB 4.6.4): " +
	"Lethe's prune would leave entities behind; upgrade FalkorDB")

// checkSubqueries is the read that checks, once per client, that the
// server runs a CALL subquery per row; none once it did.
func (g *Graph) checkSubqueries() read {
	if g.c.subqueriesChecked.Load() {
		return read{}
	}
	return read{subqueryCheck, func(res *falkordb.QueryResult) error {
		n, err := scalar(res)
		if err != nil {
			return err
		}
		if n != 2 {
			return errSubqueries
		}
		g.c.subqueriesChecked.Store(true)
		return nil
	}}
}

const indexesUnderConstruction = "CALL db.indexes() YIELD status WHERE status <> 'OPERATIONAL' RETURN count(status)"

// waitForIndexes returns once no index of the graph is still being built.
// FalkorDB builds an index on existing data in the background, and deleting
// nodes while it does so corrupted the graph in our runs (a later read of
// the label failed with "Attempted to access undefined attribute" and a
// further one crashed the server). So Lethe never deletes while an index,
// its own or anyone's, is under construction.
func (g *Graph) waitForIndexes(ctx context.Context) error {
	for {
		n, err := g.count(ctx, indexesUnderConstruction, nil)
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
// the graph, so that they exist before the first erasure. It also has
// FalkorDB finish the work it defers after writes (settle).
func (g *Graph) EnsureIndexes(ctx context.Context) error {
	l, err := g.readLayout(ctx)
	if err != nil || len(l.sessionLabels) == 0 && !l.hasSession && !l.hasEntity {
		return err // no graph (yet): nothing to settle
	}
	return g.readAll(ctx, nil, syncLabels(l), settle)
}

// settle reads one node's labels and relationships in both directions.
// After a bulk write by the deriver with no read since, FalkorDB brought its
// matrices up to date only when a query first needed them: the first
// undirected traversal took 70–115 ms and the first node deletion 20–70 ms
// (node labels) on a graph of 1M elements, where they take 1–5 ms
// afterwards. Done here, that work is not an erasure's; with nothing
// pending it costs about a millisecond.
var settle = read{"MATCH (x) WITH x LIMIT 1 OPTIONAL MATCH (x)-[q]-() RETURN labels(x), count(q)",
	func(*falkordb.QueryResult) error { return nil }}

// names takes a column of label or type names into out, sorted.
func names(out *[]string) func(*falkordb.QueryResult) error {
	return func(res *falkordb.QueryResult) error {
		cells, err := column(res)
		if err != nil {
			return err
		}
		for _, v := range cells {
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("a label or type name is a %T", v)
			}
			if _, err := quoteName(s); err != nil {
				return err
			}
			*out = append(*out, s)
		}
		slices.Sort(*out)
		return nil
	}
}

// ensureIndexes indexes every provenance property Lethe queries by, so that
// the targeted step reads only the erased sessions' elements. FalkorDB has no
// CREATE INDEX IF NOT EXISTS: "already indexed" counts as done. Indexes
// known to exist are remembered per client. It reports whether it asked
// for one.
func (g *Graph) ensureIndexes(ctx context.Context, l layout) (created bool, err error) {
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
		created = true
		_, err := g.Query(ctx, "CREATE INDEX FOR "+w.pattern+" ON (n."+w.prop+")", nil)
		if err != nil && !strings.Contains(err.Error(), "already indexed") {
			return created, fmt.Errorf("index %s.%s: %w", w.pattern, w.prop, err)
		}
		g.c.indexed.Store(key, true)
	}
	return created, nil
}
