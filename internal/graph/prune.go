package graph

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
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
// What the deletes need is read in one round trip, and the deletes go in
// pipelines (drainAll): on a graph of 1M elements, round trips and reading
// the same entities' relationships again took most of the time.
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
	p := map[string]any{"ids": ids, "n": limit}
	// Before anything is deleted: the label scans (syncLabels); the
	// relationship counts per type, since entity deletions remove
	// relationships without saying which type; the entities the sessions'
	// relationships touch, kept to catch at the end the ones left
	// unattested, and among them those only these sessions attest; and the
	// entities attached to the sessions' nodes by relationships without
	// provenance, kept to go at the end if that leaves them bare (after an
	// interruption, the sweep's unattached entities catch them).
	touched, doomed, lone := newKeySet(), newKeySet(), newKeySet()
	if err := g.readAll(ctx, p, syncLabels(l), countRelationships(l, propSessionID, removed),
		touchedEntities(l, propSessionID, touched, doomed), sessionNodeNeighbours(l, lone)); err != nil {
		return removed, err
	}
	// removed holds only the counts just read.
	manyRels := slices.ContainsFunc(slices.Collect(maps.Values(removed.Relationships)), func(n int64) bool { return n >= int64(limit) })
	if err := g.pruneDoomedEntities(ctx, propSessionID, p, doomed.list, limit, removed, lone); err != nil {
		return removed, err
	}
	// Then the sessions' relationships, their nodes, and the entities left
	// unattested or bare, in one pipeline sent again while a query in it
	// deleted limit elements (drainAll): each query sees what those before
	// it removed, and the last round finds nothing more to remove before the
	// entities are checked. A type with limit or more relationships has them
	// deleted first, alone: a node deleted before they were all gone would
	// take the rest along, counted as attached.
	rels := relationshipDeletes(l, propSessionID)
	if manyRels {
		if err := g.drainAll(ctx, p, limit, rels...); err != nil {
			return removed, err
		}
		rels = nil
	}
	p["touched"], p["lone"] = touched.list, lone.list
	dels := append(rels, sessionNodeDeletes(l, removed)...)
	if err := g.drainAll(ctx, p, limit, append(dels, leftEntityDeletes(touched.list, lone.list, removed)...)...); err != nil {
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

// relationshipCounts returns, per relationship type, a query counting the
// relationships whose prop (session_id or fact_id) is in $ids through the
// type's index, as one row (kind 'r', name the type, n), for a UNION ALL.
// Names are plain identifiers (see names), safe inside quotes.
func relationshipCounts(l layout, prop string) []string {
	var qs []string
	for _, t := range l.relTypes {
		qs = append(qs, "MATCH ()-[r:`"+t+"`]->() WHERE r."+prop+" IN $ids WITH count(r) AS n RETURN 'r' AS kind, '"+t+"' AS name, n")
	}
	return qs
}

// countRelationships adds to removed, by type, the relationships whose prop
// is in $ids: every type's count in one query.
func countRelationships(l layout, prop string, removed Counts) read {
	return read{strings.Join(relationshipCounts(l, prop), " UNION ALL "), func(res *falkordb.QueryResult) error {
		return eachCount(res, func(_, name string, n int64) {
			if n > 0 {
				removed.Relationships[name] += n
			}
		})
	}}
}

// touchedEntities adds to touched the keys of the entities the
// relationships whose prop is in $ids touch, and to doomed those of them
// that no relationship with provenance outside $ids touches (see
// doomedEntities), in one query: each entity's relationships are read once,
// however many of these relationships reach it (reading them is the
// costliest part of a prune, ~2.5 µs per relationship).
func touchedEntities(l layout, prop string, touched, doomed *keySet) read {
	if !l.hasEntity || len(l.relTypes) == 0 {
		return read{}
	}
	var qs []string
	for _, t := range l.relTypes {
		qs = append(qs, "MATCH (a)-[r:`"+t+"`]->(b) WHERE r."+prop+" IN $ids UNWIND [a.key, b.key] AS k RETURN k")
	}
	q := "CALL { " + strings.Join(qs, " UNION ") + " }\nWITH collect(DISTINCT k) AS keys\n" + othersIn("keys", prop) + "RETURN k, others = 0"
	return read{q, func(res *falkordb.QueryResult) error {
		for res.Next() {
			rec := res.Record()
			k, err := rec.GetByIndex(0)
			if err != nil {
				return err
			}
			alone, err := rec.GetByIndex(1)
			if err != nil {
				return err
			}
			touched.add(k)
			if alone == true {
				doomed.add(k)
			}
		}
		return nil
	}}
}

// pruneDoomedEntities deletes the entities among keys (found by
// touchedEntities) that still no relationship with provenance outside $ids
// touches, and adds them to removed: their relationships without provenance
// first, counted as attached to erased nodes, with the entities at their
// other end added to lone; then the entities, which DELETE takes the
// relationships of the erased IDs along with (counted beforehand). Each
// query checks the entities again, so one that gained another's
// relationship meanwhile stays.
func (g *Graph) pruneDoomedEntities(ctx context.Context, prop string, p map[string]any, keys []any, limit int, removed Counts, lone *keySet) error {
	if len(keys) == 0 {
		return nil
	}
	doomed := othersIn("$keys", prop) + "WHERE others = 0\n"
	q := map[string]any{"ids": p["ids"], "keys": keys, "n": limit}
	_, rels, err := g.drainKeys(ctx, doomed+"MATCH (e)-[u]-(n) WHERE "+withoutProvenance+
		" WITH u, n.key AS nk LIMIT $n DELETE u RETURN count(u), collect(DISTINCT nk)", q, limit, lone)
	if err != nil {
		return err
	}
	removed.Relationships[AttachedKey] += rels
	nodes, _, err := g.drain(ctx, doomed+"WITH e LIMIT $n DELETE e RETURN count(e)", q, limit)
	if err != nil {
		return err
	}
	removed.Nodes[LabelEntity] += nodes
	return nil
}

// relationshipDeletes deletes the relationships whose prop is in $ids
// (counted beforehand), one query per type.
func relationshipDeletes(l layout, prop string) []del {
	var ds []del
	for _, t := range l.relTypes {
		ds = append(ds, del{"MATCH ()-[r:`" + t + "`]->() WHERE r." + prop + " IN $ids WITH r LIMIT $n DELETE r RETURN count(r)", nil})
	}
	return ds
}

// sessionNodeNeighbours adds to lone the entities attached to the nodes of
// the sessions in $ids by relationships without provenance: deleting those
// nodes takes the relationships along and may leave the entities bare.
func sessionNodeNeighbours(l layout, lone *keySet) read {
	if !l.hasEntity {
		return read{}
	}
	var qs []string
	for _, lb := range l.sessionLabels {
		qs = append(qs, "MATCH (x:`"+lb+"`) WHERE x.session_id IN $ids MATCH (x)-[u]-(n) WHERE "+withoutProvenance+" RETURN n.key AS k")
	}
	if l.hasSession {
		qs = append(qs, "UNWIND $ids AS i MATCH (x:`"+LabelSession+"` {id: i})-[u]-(n) WHERE "+withoutProvenance+" RETURN n.key AS k")
	}
	return read{strings.Join(qs, " UNION "), func(res *falkordb.QueryResult) error {
		col, err := column(res)
		lone.add(col...)
		return err
	}}
}

// leftEntityDeletes deletes the entities no relationship that matters
// touches any more, and adds them to removed, with what is left of their
// relationships: among $touched, the entities the erased sessions'
// relationships touched, those with no relationship with provenance left
// (another attested them too, and that provenance went meanwhile); among
// $lone, the entities attached only to erased elements by relationships
// without provenance, those with no relationship at all (after the touched
// ones, so that they see them gone).
func leftEntityDeletes(touched, lone []any, removed Counts) []del {
	// Two requests pruning sessions that share an entity at once each see
	// the other's relationship and keep the entity; whichever deletes its
	// relationships last finds it with none left here (FalkorDB runs writes
	// one at a time). The history checker found such orphans.
	left := func(keys, cond string) del {
		return del{"UNWIND " + keys + " AS k MATCH (e:`" + LabelEntity + "` {key: k}) " + anyRelationship(cond, "held") +
			"WITH e, held WHERE held = 0 WITH e LIMIT $n DELETE e RETURN count(e)", func(nodes, rels int64) {
			removed.Nodes[LabelEntity] += nodes
			removed.Relationships[AttachedKey] += rels
		}}
	}
	var ds []del
	if len(touched) > 0 {
		ds = append(ds, left("$touched", withProvenance))
	}
	if len(lone) > 0 {
		ds = append(ds, left("$lone", "true"))
	}
	return ds
}

// sessionNodeDeletes deletes the nodes of the sessions in $ids (their
// session-provenance nodes, then the sessions themselves) and adds them to
// removed, with the relationships of other provenance they take along.
func sessionNodeDeletes(l layout, removed Counts) []del {
	took := func(label string) func(nodes, rels int64) {
		return func(nodes, rels int64) {
			removed.Nodes[label] += nodes
			removed.Relationships[AttachedKey] += rels
		}
	}
	var ds []del
	for _, lb := range l.sessionLabels {
		ds = append(ds, del{"MATCH (x:`" + lb + "`) WHERE x.session_id IN $ids WITH x LIMIT $n DELETE x RETURN count(x)", took(lb)})
	}
	if l.hasSession {
		ds = append(ds, del{"UNWIND $ids AS i MATCH (x:`" + LabelSession + "` {id: i}) WITH x LIMIT $n DELETE x RETURN count(x)", took(LabelSession)})
	}
	return ds
}

// Count finds what the graph still holds from the given sessions: their
// nodes and relationships by provenance, and the entities attested only by
// them (counted once per pattern that reaches them, as before). After a
// prune every count must be zero. Every part is counted through a
// provenance index, in one query; the entities are counted in a second one
// only when relationships of the sessions are left: they are found from
// those relationships, so with none (a verification after a prune, the
// usual case) there are none, and their query, the costliest, is skipped.
func (g *Graph) Count(ctx context.Context, ids []string) (Counts, error) {
	found := newCounts()
	if err := checkSessionIDs(ids); err != nil || len(ids) == 0 {
		return found, err
	}
	l, err := g.readLayout(ctx)
	if err != nil {
		return found, err
	}
	qs := relationshipCounts(l, propSessionID)
	for _, lb := range l.sessionLabels {
		qs = append(qs, "MATCH (x:`"+lb+"`) WHERE x.session_id IN $ids WITH count(x) AS n RETURN 'n' AS kind, '"+lb+"' AS name, n")
	}
	if l.hasSession {
		qs = append(qs, "MATCH (x:`"+LabelSession+"`) WHERE x.id IN $ids WITH count(x) AS n RETURN 'n' AS kind, '"+LabelSession+"' AS name, n")
	}
	take := func(res *falkordb.QueryResult) error {
		return eachCount(res, func(kind, name string, n int64) {
			if kind == "r" {
				found.Relationships[name] += n
			} else {
				found.Nodes[name] += n
			}
		})
	}
	p := map[string]any{"ids": ids}
	if err := g.readAll(ctx, p, read{strings.Join(qs, " UNION ALL "), take}); err != nil || !l.hasEntity {
		return found, err
	}
	if found.RelationshipTotal() == 0 {
		if len(l.relTypes) > 0 {
			found.Nodes[LabelEntity] = 0 // the row the skipped query gives
		}
		return found, nil
	}
	var es []string
	for _, pat := range directed(l.relTypes) {
		es = append(es, doomedEntities(pat, propSessionID)+"WITH count(e) AS n RETURN 'n' AS kind, '"+LabelEntity+"' AS name, n")
	}
	return found, g.readAll(ctx, p, read{strings.Join(es, " UNION ALL "), take})
}

func (g *Graph) count(ctx context.Context, q string, p map[string]any) (int64, error) {
	res, err := g.ReadQuery(ctx, q, p)
	if err != nil {
		return 0, err
	}
	return scalar(res)
}

// eachCount calls f with every row (kind, name, n) of res.
func eachCount(res *falkordb.QueryResult, f func(kind, name string, n int64)) error {
	for res.Next() {
		rec := res.Record()
		kind, err := rec.GetByIndex(0)
		if err != nil {
			return err
		}
		name, err := rec.GetByIndex(1)
		if err != nil {
			return err
		}
		n, err := intCell(rec, 2)
		if err != nil {
			return err
		}
		k, ok1 := kind.(string)
		nm, ok2 := name.(string)
		if !ok1 || !ok2 {
			return fmt.Errorf("count query returned %T, %T, want strings", kind, name)
		}
		f(k, nm, n)
	}
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

// del is a delete query whose first column counts what it deleted (at most
// $n), paired with the function that takes the nodes and relationships it
// deleted (nil: none to take).
type del struct {
	q    string
	took func(nodes, rels int64)
}

// drainAll is drain for several delete queries sent in one round trip
// (pipe): the whole pipeline is sent again while any of its queries deleted
// limit elements, so that every query runs once more after the others'
// last batches; one with nothing left to delete costs an index lookup.
func (g *Graph) drainAll(ctx context.Context, p map[string]any, limit int, ds ...del) error {
	qs := make([]string, len(ds))
	for i, d := range ds {
		qs[i] = d.q
	}
	for len(qs) > 0 {
		res, err := g.pipe(ctx, "GRAPH.QUERY", qs, p)
		if err != nil {
			return err
		}
		more := false
		for i, r := range res {
			if ds[i].took != nil {
				ds[i].took(int64(r.NodesDeleted()), int64(r.RelationshipsDeleted()))
			}
			n, err := scalar(r)
			if err != nil {
				return err
			}
			more = more || n >= int64(limit)
		}
		if !more {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
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
// lookup does not flush; a label scan, even LIMIT 1, does. The scans are
// the branches of one query, each a label scan of its own.
func syncLabels(l layout) read {
	var qs []string
	if l.hasSession {
		qs = append(qs, "MATCH (x:`"+LabelSession+"`) RETURN x.id AS v LIMIT 1")
	}
	if l.hasEntity {
		qs = append(qs, "MATCH (x:`"+LabelEntity+"`) RETURN x.key AS v LIMIT 1")
	}
	for _, lb := range l.sessionLabels {
		qs = append(qs, "MATCH (x:`"+lb+"`) RETURN x.session_id AS v LIMIT 1")
	}
	// Relationship types are not scanned: no such failure was seen with
	// them, and a scan costs 8–17 ms each on a 1M-element graph.
	return read{strings.Join(qs, " UNION ALL "), func(*falkordb.QueryResult) error { return nil }}
}

// read is a read query paired with the function that takes its result, so
// that several go in one round trip (readAll) and each result is read by
// its own reader, never by position. A read with no query is skipped.
type read struct {
	q    string
	take func(*falkordb.QueryResult) error
}

// readAll runs the reads, with parameters p, in one round trip.
func (g *Graph) readAll(ctx context.Context, p map[string]any, rs ...read) error {
	var qs []string
	var takes []func(*falkordb.QueryResult) error
	for _, r := range rs {
		if r.q != "" {
			qs, takes = append(qs, r.q), append(takes, r.take)
		}
	}
	if len(qs) == 0 {
		return nil
	}
	res, err := g.pipe(ctx, "GRAPH.RO_QUERY", qs, p)
	if err != nil {
		return err
	}
	for i, take := range takes {
		if err := take(res[i]); err != nil {
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
