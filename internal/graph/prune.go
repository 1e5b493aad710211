package graph

import (
	"context"
	"fmt"
	"regexp"
	"sync"

	"github.com/FalkorDB/falkordb-go/v2"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// sessionID is the canonical lowercase UUID form the API admits; nothing
// else is ever sent to the graph as a session ID.
var sessionID = regexp.MustCompile(lethev1.SessionIDPattern)

// AttachedKey counts relationships not of the erased provenance (another's, or
// none) deleted with the erased nodes they were attached to.
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

// Prune removes what the graph holds only because of the given sessions:
// first the entities no relationship with other provenance attests (their
// relationships without provenance counted and deleted first, then the
// entities, which DELETE takes the sessions' relationships along with),
// then the sessions' remaining relationships, then their nodes, and last
// the entities left unattested. Every query deletes at most limit elements
// and matches by application IDs through the provenance indexes, never by
// FalkorDB's internal IDs (reused after deletes). Each query is atomic and
// the order keeps a repeat after an interruption correct: an entity loses
// relationships of the erased sessions only once it is known to have others.
func (g *Graph) Prune(ctx context.Context, ids []string, limit int) (Counts, error) {
	removed := newCounts()
	if err := checkSessionIDs(ids); err != nil || len(ids) == 0 {
		return removed, err
	}
	unlock, err := g.lockPrune(ctx)
	if err != nil {
		return removed, err
	}
	defer unlock()
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
	if err := g.countRelationships(ctx, l, propSessionID, p, removed); err != nil {
		return removed, err
	}
	// The entities attached to erased elements by relationships without
	// provenance are kept, to go at the end if that leaves them bare (after
	// an interruption, the sweep's unattached entities catch them).
	lone := newKeySet()
	if err := g.pruneDoomedEntities(ctx, l, propSessionID, p, limit, removed, lone); err != nil {
		return removed, err
	}
	// The entities these sessions' relationships reach, kept to catch the
	// ones left unattested below.
	attested := newKeySet()
	if err := g.entityKeys(ctx, l, p, attested); err != nil {
		return removed, err
	}
	if err := g.sessionNodeNeighbours(ctx, l, p, lone); err != nil {
		return removed, err
	}
	if err := g.deleteSessionRelationships(ctx, l, p, limit); err != nil {
		return removed, err
	}
	if err := g.pruneSessionNodes(ctx, l, p, limit, removed); err != nil {
		return removed, err
	}
	if err := g.pruneLeftEntities(ctx, attested.list, withProvenance, limit, removed); err != nil {
		return removed, err
	}
	if err := g.pruneLeftEntities(ctx, lone.list, "", limit, removed); err != nil {
		return removed, err
	}
	dropZeros(removed)
	return removed, nil
}

// pruneLocks holds one lock per graph (server and name): prunes of one
// graph run one at a time. Two at once, of requests whose sessions share an
// entity, each kept it for the other's relationship, then deleted their
// own; an interruption before the last check left it with none, and the
// retry no longer reached it.
var pruneLocks sync.Map

// lockPrune takes the graph's prune lock, or gives up when ctx ends.
func (g *Graph) lockPrune(ctx context.Context) (func(), error) {
	v, _ := pruneLocks.LoadOrStore(g.c.host+"/"+g.name, make(chan struct{}, 1))
	sem := v.(chan struct{})
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// countRelationships adds to removed, by type, the relationships whose
// prop (session_id or fact_id) is in p's ids.
func (g *Graph) countRelationships(ctx context.Context, l layout, prop string, p map[string]any, removed Counts) error {
	for _, t := range l.relTypes {
		n, err := g.count(ctx, "MATCH ()-[r:`"+t+"`]->() WHERE r."+prop+" IN $ids RETURN count(r)", p)
		if err != nil {
			return err
		}
		if n > 0 {
			removed.Relationships[t] += n
		}
	}
	return nil
}

// pruneDoomedEntities deletes the entities only the IDs in p attest (see
// doomedEntities) and adds them to removed. Their relationships without
// provenance are deleted first, counted as attached to erased nodes, and
// the entities at their other end added to lone; DELETE then takes the
// relationships of the erased IDs along (counted beforehand).
func (g *Graph) pruneDoomedEntities(ctx context.Context, l layout, prop string, p map[string]any, limit int, removed Counts, lone *keySet) error {
	if !l.hasEntity {
		return nil
	}
	for _, pat := range directed(l.relTypes) {
		doomed := doomedEntities(pat, prop)
		_, rels, err := g.drainKeys(ctx, doomed+"MATCH (e)-[u]-(n) WHERE "+withoutProvenance+
			" WITH u, n.key AS nk LIMIT $n DELETE u RETURN count(u), collect(DISTINCT nk)", p, limit, lone)
		if err != nil {
			return err
		}
		removed.Relationships[AttachedKey] += rels
		nodes, _, err := g.drain(ctx, doomed+"WITH e LIMIT $n DELETE e RETURN count(e)", p, limit)
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

// sessionNodeNeighbours adds to lone the entities attached to the nodes of
// the sessions in p by relationships without provenance: deleting those
// nodes takes the relationships along and may leave the entities bare.
func (g *Graph) sessionNodeNeighbours(ctx context.Context, l layout, p map[string]any, lone *keySet) error {
	if !l.hasEntity {
		return nil
	}
	var qs []string
	for _, lb := range l.sessionLabels {
		qs = append(qs, "MATCH (x:`"+lb+"`) WHERE x.session_id IN $ids MATCH (x)-[u]-(n) WHERE "+withoutProvenance+" RETURN DISTINCT n.key")
	}
	if l.hasSession {
		qs = append(qs, "UNWIND $ids AS i MATCH (x:`"+LabelSession+"` {id: i})-[u]-(n) WHERE "+withoutProvenance+" RETURN DISTINCT n.key")
	}
	for _, q := range qs {
		if err := g.readKeys(ctx, q, p, lone); err != nil {
			return err
		}
	}
	return nil
}

// pruneLeftEntities deletes the entities among keys that no relationship
// matching cond (on q; "" for any) touches any more, with what is left
// of their relationships, and adds them to removed. With withProvenance it
// catches the entities the erased sessions attested and another attested
// too, when that other provenance went meanwhile; with "" the entities
// attached only to erased elements, by relationships without provenance.
func (g *Graph) pruneLeftEntities(ctx context.Context, keys []any, cond string, limit int, removed Counts) error {
	// Two requests pruning sessions that share an entity at once each see
	// the other's relationship and keep the entity; whichever deletes its
	// relationships last finds it with none left here (FalkorDB runs writes
	// one at a time). The history checker found such orphans.
	if len(keys) == 0 {
		return nil
	}
	if cond != "" {
		cond = " WHERE " + cond
	}
	nodes, rels, err := g.drain(ctx, "UNWIND $keys AS k MATCH (e:`"+LabelEntity+"` {key: k}) OPTIONAL MATCH (e)-[q]-()"+cond+
		" WITH e, count(q) AS rels WHERE rels = 0 WITH e LIMIT $n DELETE e RETURN count(e)",
		map[string]any{"keys": keys, "n": limit}, limit)
	if err != nil {
		return err
	}
	removed.Nodes[LabelEntity] += nodes
	removed.Relationships[AttachedKey] += rels
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
			n, err := g.count(ctx, doomedEntities(pat, propSessionID)+"RETURN count(e)", p)
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

// entityKeys adds to keys the entities the sessions' relationships reach.
func (g *Graph) entityKeys(ctx context.Context, l layout, p map[string]any, keys *keySet) error {
	if !l.hasEntity {
		return nil
	}
	for _, pat := range directed(l.relTypes) {
		if err := g.readKeys(ctx, "MATCH "+pat+" WHERE r.session_id IN $ids RETURN DISTINCT e.key", p, keys); err != nil {
			return err
		}
	}
	return nil
}

// readKeys adds the keys in q's first column to keys.
func (g *Graph) readKeys(ctx context.Context, q string, p map[string]any, keys *keySet) error {
	res, err := g.ReadQuery(ctx, q, p)
	if err != nil {
		return err
	}
	col, err := column(res)
	if err != nil {
		return err
	}
	keys.add(col...)
	return nil
}

// keySet holds entity keys once each, in the order found.
type keySet struct {
	seen map[string]bool
	list []any
}

func newKeySet() *keySet { return &keySet{seen: map[string]bool{}} }

// add adds the string values (keys); others (null: a node without key) are skipped.
func (s *keySet) add(vs ...any) {
	for _, v := range vs {
		if k, ok := v.(string); ok && !s.seen[k] {
			s.seen[k] = true
			s.list = append(s.list, k)
		}
	}
}

// drain repeats a bounded delete until it removes fewer than limit
// elements, and sums the nodes and relationships it deleted.
func (g *Graph) drain(ctx context.Context, q string, p map[string]any, limit int) (nodes, rels int64, err error) {
	return g.drainKeys(ctx, q, p, limit, nil)
}

// drainKeys is drain for a query whose second column, when keys is not
// nil, is a list of entity keys to add to keys.
func (g *Graph) drainKeys(ctx context.Context, q string, p map[string]any, limit int, keys *keySet) (nodes, rels int64, err error) {
	for {
		var res *falkordb.QueryResult
		res, err = g.Query(ctx, q, p)
		if err != nil {
			return nodes, rels, err
		}
		nodes += int64(res.NodesDeleted())
		rels += int64(res.RelationshipsDeleted())
		if !res.Next() {
			return nodes, rels, errNoRow
		}
		n, err := intCell(res.Record(), 0)
		if err != nil {
			return nodes, rels, err
		}
		if keys != nil {
			if err := addKeyList(res.Record(), keys); err != nil {
				return nodes, rels, err
			}
		}
		if n < int64(limit) {
			return nodes, rels, nil
		}
		if err := ctx.Err(); err != nil {
			return nodes, rels, err
		}
	}
}

// addKeyList adds the list in the record's second column to keys.
func addKeyList(rec *falkordb.Record, keys *keySet) error {
	cell, err := rec.GetByIndex(1)
	if err != nil {
		return err
	}
	list, ok := cell.([]any)
	if !ok {
		return fmt.Errorf("query returned %T, want a list of keys", cell)
	}
	keys.add(list...)
	return nil
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
