package graph

import (
	"context"
	"fmt"
	"regexp"

	"github.com/FalkorDB/falkordb-go/v2"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// sessionID is the canonical lowercase UUID form the API admits; nothing
// else is ever sent to the graph as a session ID.
var sessionID = regexp.MustCompile(lethev1.SessionIDPattern)

// AttachedKey counts relationships of other provenance attached to erased nodes.
const AttachedKey = erasure.GraphAttachedKey

// Counts is what a prune removed, or a count found (the erasure port's type).
type Counts = erasure.GraphCounts

// KeyCount is one entry of Counts.Keys.
type KeyCount = erasure.KeyCount

var _ erasure.Graph = (*Graph)(nil)

func newCounts() Counts {
	return Counts{Nodes: map[string]int64{}, Relationships: map[string]int64{}}
}

func checkSessionIDs(ids []string) error {
	for _, id := range ids {
		if !sessionID.MatchString(id) {
			return fmt.Errorf("session ID %q is not a lowercase canonical UUID", id)
		}
	}
	return nil
}

// doomedEntities matches the entities touched by a relationship of type T
// from the erased sessions whose every relationship comes from them: once
// those go, nothing else attests the entity. A relationship without
// session_id counts as other provenance, so such entities stay.
//
// %s is a directed pattern around (e), "()-[r:T]->(e)" or "(e)-[r:T]->()".
// The shape works around three behaviours of FalkorDB 4.16.3: an undirected
// pattern driven by a relationship index misses matches; a label check on
// (e) anywhere before an aggregation turns the index scan into a scan of
// every node (0.5 s instead of 2 ms on 130k elements); and collecting the
// nodes themselves in a query that deletes left other nodes' attributes
// unreadable ("Attempted to access undefined attribute", then a crash).
// So the endpoints' keys (application IDs) are collected and the entities
// found again by key.
const doomedEntities = `MATCH %s WHERE r.session_id IN $ids
WITH collect(DISTINCT e.key) AS keys
UNWIND keys AS k
MATCH (e:` + "`" + LabelEntity + "`" + ` {key: k})
OPTIONAL MATCH (e)-[q]-() WHERE q.session_id IS NULL OR NOT q.session_id IN $ids
WITH e, count(q) AS others
WHERE others = 0
`

// Prune removes what the graph holds only because of the given sessions:
// first the entities every relationship of which comes from them (DELETE
// takes those relationships along), then the sessions' remaining
// relationships, then their nodes. Every query deletes at most limit
// elements and matches by application IDs through the provenance indexes,
// never by FalkorDB's internal IDs (reused after deletes). Each query is
// atomic and the order keeps a repeat after an interruption correct: an
// entity loses relationships of the erased sessions only once it is known
// to have others.
func (g *Graph) Prune(ctx context.Context, ids []string, limit int) (Counts, error) {
	removed := newCounts()
	if err := checkSessionIDs(ids); err != nil || len(ids) == 0 {
		return removed, err
	}
	if limit < 1 {
		limit = 1000
	}
	l, err := g.readLayout(ctx)
	if err != nil {
		return removed, err
	}
	if err := g.syncLabels(ctx, l); err != nil {
		return removed, err
	}
	p := map[string]any{"ids": ids, "n": limit}
	// Relationship counts per type are taken first: entity deletions remove
	// relationships without saying which type.
	if err := g.countSessionRelationships(ctx, l, p, removed); err != nil {
		return removed, err
	}
	if err := g.pruneDoomedEntities(ctx, l, p, limit, removed); err != nil {
		return removed, err
	}
	// The entities these sessions' relationships reach, kept to catch the
	// ones left with no relationship below.
	var touched []any
	if l.hasEntity {
		if touched, err = g.entityKeys(ctx, l, p); err != nil {
			return removed, err
		}
	}
	if err := g.deleteSessionRelationships(ctx, l, p, limit); err != nil {
		return removed, err
	}
	if err := g.pruneBareEntities(ctx, touched, limit, removed); err != nil {
		return removed, err
	}
	if err := g.pruneSessionNodes(ctx, l, p, limit, removed); err != nil {
		return removed, err
	}
	dropZeros(removed)
	return removed, nil
}

// countSessionRelationships adds to removed, by type, the relationships the
// sessions in p gave the graph.
func (g *Graph) countSessionRelationships(ctx context.Context, l layout, p map[string]any, removed Counts) error {
	for _, t := range l.relTypes {
		n, err := g.count(ctx, "MATCH ()-[r:`"+t+"`]->() WHERE r.session_id IN $ids RETURN count(r)", p)
		if err != nil {
			return err
		}
		if n > 0 {
			removed.Relationships[t] = n
		}
	}
	return nil
}

// pruneDoomedEntities deletes the entities only the sessions in p attest
// (with their relationships) and adds them to removed.
func (g *Graph) pruneDoomedEntities(ctx context.Context, l layout, p map[string]any, limit int, removed Counts) error {
	if !l.hasEntity {
		return nil
	}
	for _, pat := range directed(l.relTypes) {
		q := fmt.Sprintf(doomedEntities, pat) + "WITH e LIMIT $n DELETE e RETURN count(e)"
		nodes, _, err := g.drain(ctx, q, p, limit)
		if err != nil {
			return err
		}
		removed.Nodes[LabelEntity] += nodes
	}
	return nil
}

// deleteSessionRelationships deletes the relationships the sessions in p
// gave the graph (already counted).
func (g *Graph) deleteSessionRelationships(ctx context.Context, l layout, p map[string]any, limit int) error {
	for _, t := range l.relTypes {
		if _, _, err := g.drain(ctx, "MATCH ()-[r:`"+t+"`]->() WHERE r.session_id IN $ids WITH r LIMIT $n DELETE r RETURN count(r)", p, limit); err != nil {
			return err
		}
	}
	return nil
}

// pruneBareEntities deletes the touched entities (by key) left with no
// relationship at all, and adds them to removed.
func (g *Graph) pruneBareEntities(ctx context.Context, touched []any, limit int, removed Counts) error {
	// Two requests pruning sessions that share an entity at once each see
	// the other's relationship and keep the entity; whichever deletes its
	// relationships last finds it with none left here (FalkorDB runs writes
	// one at a time). The history checker found such orphans.
	if len(touched) == 0 {
		return nil
	}
	nodes, _, err := g.drain(ctx, "UNWIND $keys AS k MATCH (e:`"+LabelEntity+"` {key: k}) OPTIONAL MATCH (e)-[q]-() WITH e, count(q) AS rels WHERE rels = 0 WITH e LIMIT $n DELETE e RETURN count(e)",
		map[string]any{"keys": touched, "n": limit}, limit)
	if err != nil {
		return err
	}
	removed.Nodes[LabelEntity] += nodes
	return nil
}

// pruneSessionNodes deletes the nodes of the sessions in p (their
// session-provenance nodes, then the sessions themselves) and adds them to
// removed, with the relationships of other provenance they took along.
func (g *Graph) pruneSessionNodes(ctx context.Context, l layout, p map[string]any, limit int, removed Counts) error {
	for _, lb := range l.sessionLabels {
		nodes, rels, err := g.drain(ctx, "MATCH (x:`"+lb+"`) WHERE x.session_id IN $ids WITH x LIMIT $n DELETE x RETURN count(x)", p, limit)
		if err != nil {
			return err
		}
		removed.Nodes[lb] += nodes
		removed.Relationships[AttachedKey] += rels
	}
	if l.hasSession {
		nodes, rels, err := g.drain(ctx, "UNWIND $ids AS i MATCH (x:`"+LabelSession+"` {id: i}) WITH x LIMIT $n DELETE x RETURN count(x)", p, limit)
		if err != nil {
			return err
		}
		removed.Nodes[LabelSession] += nodes
		removed.Relationships[AttachedKey] += rels
	}
	return nil
}

// Count finds what the graph still holds from the given sessions: their
// nodes and relationships by provenance, and the entities attested only by
// them. After a prune every count must be zero.
func (g *Graph) Count(ctx context.Context, ids []string) (Counts, error) {
	found := newCounts()
	if err := checkSessionIDs(ids); err != nil || len(ids) == 0 {
		return found, err
	}
	l, err := g.readLayout(ctx)
	if err != nil {
		return found, err
	}
	p := map[string]any{"ids": ids}
	for _, t := range l.relTypes {
		n, err := g.count(ctx, "MATCH ()-[r:`"+t+"`]->() WHERE r.session_id IN $ids RETURN count(r)", p)
		if err != nil {
			return found, err
		}
		found.Relationships[t] = n
	}
	for _, lb := range l.sessionLabels {
		n, err := g.count(ctx, "MATCH (x:`"+lb+"`) WHERE x.session_id IN $ids RETURN count(x)", p)
		if err != nil {
			return found, err
		}
		found.Nodes[lb] = n
	}
	if l.hasSession {
		n, err := g.count(ctx, "MATCH (x:`"+LabelSession+"`) WHERE x.id IN $ids RETURN count(x)", p)
		if err != nil {
			return found, err
		}
		found.Nodes[LabelSession] = n
	}
	if l.hasEntity {
		for _, pat := range directed(l.relTypes) {
			n, err := g.count(ctx, fmt.Sprintf(doomedEntities, pat)+"RETURN count(e)", p)
			if err != nil {
				return found, err
			}
			found.Nodes[LabelEntity] += n
		}
	}
	return found, nil
}

func (g *Graph) count(ctx context.Context, q string, p map[string]any) (int64, error) {
	res, err := g.ReadQuery(ctx, q, p)
	if err != nil {
		return 0, err
	}
	return scalar(res)
}

// entityKeys lists the keys of the entities the sessions' relationships reach.
func (g *Graph) entityKeys(ctx context.Context, l layout, p map[string]any) ([]any, error) {
	seen := map[string]bool{}
	var keys []any
	for _, pat := range directed(l.relTypes) {
		res, err := g.ReadQuery(ctx, "MATCH "+pat+" WHERE r.session_id IN $ids RETURN DISTINCT e.key", p)
		if err != nil {
			return nil, err
		}
		col, err := column(res)
		if err != nil {
			return nil, err
		}
		for _, v := range col {
			if k, ok := v.(string); ok && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	return keys, nil
}

// drain repeats a bounded delete until it removes fewer than limit
// elements, and sums the nodes and relationships it deleted.
func (g *Graph) drain(ctx context.Context, q string, p map[string]any, limit int) (nodes, rels int64, err error) {
	for {
		var res *falkordb.QueryResult
		res, err = g.Query(ctx, q, p)
		if err != nil {
			return nodes, rels, err
		}
		nodes += int64(res.NodesDeleted())
		rels += int64(res.RelationshipsDeleted())
		n, err := scalar(res)
		if err != nil {
			return nodes, rels, err
		}
		if n < int64(limit) {
			return nodes, rels, nil
		}
		if err := ctx.Err(); err != nil {
			return nodes, rels, err
		}
	}
}

// syncLabels scans one node of every label before anything is deleted. FalkorDB 4.16.3 keeps recent additions to a
// label in a pending delta until a scan of the label flushes it; deleting a
// node while its label still had pending additions (after a bulk write by
// the deriver, with no read since) left the deleted node in label scans,
// and every later read of the label failed with "Attempted to access
// undefined attribute" (a keys() over it crashed the server). An index
// lookup does not flush; a label scan, even LIMIT 1, does.
func (g *Graph) syncLabels(ctx context.Context, l layout) error {
	var qs []string
	if l.hasSession {
		qs = append(qs, "MATCH (x:`"+LabelSession+"`) RETURN x.id LIMIT 1")
	}
	if l.hasEntity {
		qs = append(qs, "MATCH (x:`"+LabelEntity+"`) RETURN x.key LIMIT 1")
	}
	for _, lb := range l.sessionLabels {
		qs = append(qs, "MATCH (x:`"+lb+"`) RETURN x.session_id LIMIT 1")
	}
	// Relationship types are not scanned: no such failure was seen with
	// them, and a scan costs 8–17 ms each on a 1M-element graph.
	for _, q := range qs {
		if _, err := g.ReadQuery(ctx, q, nil); err != nil {
			return err
		}
	}
	return nil
}

// directed returns both directed patterns of each relationship type.
func directed(types []string) []string {
	out := make([]string, 0, 2*len(types))
	for _, t := range types {
		out = append(out, "()-[r:`"+t+"`]->(e)", "(e)-[r:`"+t+"`]->()")
	}
	return out
}

func dropZeros(c Counts) {
	for k, v := range c.Nodes {
		if v == 0 {
			delete(c.Nodes, k)
		}
	}
	for k, v := range c.Relationships {
		if v == 0 {
			delete(c.Relationships, k)
		}
	}
}
