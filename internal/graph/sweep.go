package graph

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Source says which provenance still exists in the source of truth (the
// memory's Postgres). It returns the IDs among those given that do not.
type Source interface {
	MissingSessions(ctx context.Context, ids []string) ([]string, error)
	MissingFacts(ctx context.Context, ids []int64) ([]int64, error)
}

// SweepOptions bound the full reconciliation.
type SweepOptions struct {
	// Limit bounds the elements one delete query removes.
	Limit int
	// Chunk bounds the IDs checked against the source or pruned per call.
	Chunk int
	// MaxOrphanFraction refuses a sweep that would remove more than this
	// fraction of the sessions (or facts) the graph holds: pointed at the
	// wrong or an empty database, a sweep would otherwise wipe the graph.
	MaxOrphanFraction float64
}

// SweepResult is what a sweep checked and removed; numbers only.
type SweepResult struct {
	Removed Counts
	// SessionsChecked and FactsChecked are the distinct provenance IDs found in the graph.
	SessionsChecked, FactsChecked int
	// OrphanSessions and OrphanFacts had no row in the source.
	OrphanSessions, OrphanFacts int
	// Unverifiable counts provenance values that are not IDs the source can
	// hold (not a UUID, not an integer); their elements are left alone.
	Unverifiable int
	// ProvenancelessNodes and ProvenancelessRelationships are the elements
	// without provenance the completed sweep left in the graph (see
	// provenance.go): attached to live data, they stay, but nothing in
	// Postgres attests them.
	ProvenancelessNodes, ProvenancelessRelationships int64
}

// ErrSweepRefused is returned, with nothing removed, when the orphans
// exceed SweepOptions.MaxOrphanFraction.
var ErrSweepRefused = errors.New("sweep refused")

// Sweep is the full reconciliation of the decision record (no orphan
// policy): it removes every element whose provenance no longer exists in
// the source — sessions, then single facts, each with the entities only
// they attested and those entities' relationships without provenance — and
// then entities left with no relationship at all. Elements written after an
// erasure from a stale source have no source row and go too. Last, it
// counts the elements without provenance that are left.
func (g *Graph) Sweep(ctx context.Context, src Source, o SweepOptions) (SweepResult, error) {
	res := SweepResult{Removed: newCounts()}
	if o.Limit < 1 {
		o.Limit = 1000
	}
	if o.Chunk < 1 {
		o.Chunk = 1000
	}
	l, err := g.readLayout(ctx)
	if err != nil {
		return res, err
	}

	sessions, facts, bad, err := g.provenance(ctx, l)
	if err != nil {
		return res, err
	}
	res.SessionsChecked, res.FactsChecked, res.Unverifiable = len(sessions), len(facts), bad
	orphanSessions, err := missingIn(ctx, sessions, o.Chunk, src.MissingSessions)
	if err != nil {
		return res, err
	}
	orphanFacts, err := missingIn(ctx, facts, o.Chunk, src.MissingFacts)
	if err != nil {
		return res, err
	}
	res.OrphanSessions, res.OrphanFacts = len(orphanSessions), len(orphanFacts)
	if err := refuse("sessions", len(orphanSessions), len(sessions), o.MaxOrphanFraction); err != nil {
		return res, err
	}
	if err := refuse("facts", len(orphanFacts), len(facts), o.MaxOrphanFraction); err != nil {
		return res, err
	}

	for c := range slices.Chunk(orphanSessions, o.Chunk) {
		n, err := g.Prune(ctx, c, o.Limit)
		if err != nil {
			return res, err
		}
		res.Removed.Add(n)
	}
	for c := range slices.Chunk(orphanFacts, o.Chunk) {
		if err := g.pruneFacts(ctx, l, c, o.Limit, res.Removed); err != nil {
			return res, err
		}
	}
	if err := g.pruneUnattachedEntities(ctx, l, o.Limit, res.Removed); err != nil {
		return res, err
	}
	dropZeros(res.Removed)
	res.ProvenancelessNodes, res.ProvenancelessRelationships, err = g.countProvenanceless(ctx, l, o.Chunk)
	return res, err
}

// missingIn asks the source, chunk by chunk, which of ids it does not hold.
func missingIn[T any](ctx context.Context, ids []T, chunk int, missing func(context.Context, []T) ([]T, error)) ([]T, error) {
	var out []T
	for c := range slices.Chunk(ids, chunk) {
		m, err := missing(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

// pruneFacts deletes, as Prune does for sessions, the entities only the
// given facts attest, then the facts' relationships and fact nodes, and adds
// them to removed, with the relationships the nodes took along.
func (g *Graph) pruneFacts(ctx context.Context, l layout, facts []int64, limit int, removed Counts) error {
	p := map[string]any{"ids": facts, "n": limit}
	doomed := newKeySet()
	if err := g.readAll(ctx, p, countRelationships(l, propFactID, removed), touchedEntities(l, propFactID, newKeySet(), doomed)); err != nil {
		return err
	}
	// Entities these facts attached to others by relationships without
	// provenance are left bare at worst: the unattached entities go next.
	if err := g.pruneDoomedEntities(ctx, propFactID, p, doomed.list, limit, removed, newKeySet()); err != nil {
		return err
	}
	if err := g.drainAll(ctx, p, limit, relationshipDeletes(l, propFactID)...); err != nil {
		return err
	}
	if l.hasFact {
		nodes, rels, err := g.drain(ctx, "MATCH (x:`"+LabelFact+"`) WHERE x.id IN $ids WITH x LIMIT $n DELETE x RETURN count(x)", p, limit)
		if err != nil {
			return err
		}
		removed.Nodes[LabelFact] += nodes
		removed.Relationships[AttachedKey] += rels
	}
	return nil
}

// pruneUnattachedEntities deletes every entity left with no relationship at
// all and adds them to removed.
func (g *Graph) pruneUnattachedEntities(ctx context.Context, l layout, limit int, removed Counts) error {
	if !l.hasEntity {
		return nil
	}
	nodes, _, err := g.drain(ctx, "MATCH (e:`"+LabelEntity+"`) WHERE NOT (e)--() WITH e LIMIT $n DELETE e RETURN count(e)",
		map[string]any{"n": limit}, limit)
	if err != nil {
		return err
	}
	removed.Nodes[LabelEntity] += nodes
	return nil
}

// refuse is ErrSweepRefused when the orphans exceed maxFraction of total
// (a fraction outside (0, 1) is no limit).
func refuse(what string, orphans, total int, maxFraction float64) error {
	if maxFraction <= 0 || maxFraction >= 1 || orphans == 0 {
		return nil
	}
	if float64(orphans) > maxFraction*float64(total) {
		return fmt.Errorf("%w: %d of %d %s in the graph have no row in Postgres (more than %.0f%%); check the store points at the right database",
			ErrSweepRefused, orphans, total, what, maxFraction*100)
	}
	return nil
}

// provenance lists the distinct session and fact IDs the graph refers to.
func (g *Graph) provenance(ctx context.Context, l layout) (sessions []string, facts []int64, unverifiable int, err error) {
	var sessionQs, factQs []string
	if l.hasSession {
		sessionQs = append(sessionQs, "MATCH (x:`"+LabelSession+"`) RETURN DISTINCT x.id")
	}
	for _, lb := range l.sessionLabels {
		sessionQs = append(sessionQs, "MATCH (x:`"+lb+"`) RETURN DISTINCT x.session_id")
	}
	for _, t := range l.relTypes {
		sessionQs = append(sessionQs, "MATCH ()-[r:`"+t+"`]->() RETURN DISTINCT r.session_id")
		factQs = append(factQs, "MATCH ()-[r:`"+t+"`]->() RETURN DISTINCT r.fact_id")
	}
	if l.hasFact {
		factQs = append(factQs, "MATCH (x:`"+LabelFact+"`) RETURN DISTINCT x.id")
	}
	sessionSet, factSet := map[string]bool{}, map[int64]bool{}
	for _, q := range sessionQs {
		bad, err := distinct(ctx, g, q, sessionSet, func(v any) (string, bool) { s, ok := v.(string); return s, ok && sessionID.MatchString(s) })
		if err != nil {
			return nil, nil, 0, err
		}
		unverifiable += bad
	}
	for _, q := range factQs {
		bad, err := distinct(ctx, g, q, factSet, func(v any) (int64, bool) { f, ok := v.(int64); return f, ok })
		if err != nil {
			return nil, nil, 0, err
		}
		unverifiable += bad
	}
	return slices.Sorted(maps.Keys(sessionSet)), slices.Sorted(maps.Keys(factSet)), unverifiable, nil
}

// distinct adds the non-null values of q's first column that valid accepts
// to set, and counts the ones it does not (values the source cannot hold).
func distinct[T comparable](ctx context.Context, g *Graph, q string, set map[T]bool, valid func(any) (T, bool)) (int, error) {
	res, err := g.ReadQuery(ctx, q, nil)
	if err != nil {
		return 0, err
	}
	cells, err := column(res)
	if err != nil {
		return 0, err
	}
	bad := 0
	for _, v := range cells {
		if v == nil {
			continue
		}
		if k, ok := valid(v); ok {
			set[k] = true
		} else {
			bad++
		}
	}
	return bad, nil
}

// countProvenanceless counts the elements without provenance: relationships
// with neither session_id nor fact_id, nodes without their label's ID, and
// entities no relationship with provenance touches. It scans every type
// and label but Entity: such an entity has a relationship without
// provenance (the bare ones were just removed), so only those relationships'
// ends are checked, by key; checking every entity's relationships took 10 s
// on a 1M-element graph, a scan of a type 1-2 s.
func (g *Graph) countProvenanceless(ctx context.Context, l layout, chunk int) (nodes, rels int64, err error) {
	ends := newKeySet()
	if rels, err = g.provenancelessRelationships(ctx, l, ends); err != nil {
		return 0, 0, err
	}
	var nodeQs []string
	if l.hasSession {
		nodeQs = append(nodeQs, "MATCH (x:`"+LabelSession+"`) WHERE x.id IS NULL RETURN count(x)")
	}
	for _, lb := range l.sessionLabels {
		cond := "x.session_id IS NULL"
		if lb == LabelFact {
			cond += " AND x.id IS NULL"
		}
		nodeQs = append(nodeQs, "MATCH (x:`"+lb+"`) WHERE "+cond+" RETURN count(x)")
	}
	for _, q := range nodeQs {
		n, err := g.count(ctx, q, nil)
		if err != nil {
			return 0, 0, err
		}
		nodes += n
	}
	if !l.hasEntity {
		return nodes, rels, nil
	}
	for c := range slices.Chunk(ends.list, chunk) {
		n, err := g.count(ctx, "UNWIND $keys AS k MATCH (e:`"+LabelEntity+"` {key: k}) "+anyRelationship(withProvenance, "attesting")+
			"WITH e, attesting WHERE attesting = 0 RETURN count(e)", map[string]any{"keys": c})
		if err != nil {
			return 0, 0, err
		}
		nodes += n
	}
	return nodes, rels, nil
}

// provenancelessRelationships counts the relationships without provenance
// and adds the keys at their ends to ends.
func (g *Graph) provenancelessRelationships(ctx context.Context, l layout, ends *keySet) (int64, error) {
	var rels int64
	for _, t := range l.relTypes {
		res, err := g.ReadQuery(ctx, "MATCH (a)-[u:`"+t+"`]->(b) WHERE "+withoutProvenance+
			" RETURN count(u), collect(DISTINCT a.key) + collect(DISTINCT b.key)", nil)
		if err != nil {
			return 0, err
		}
		if !res.Next() {
			return 0, errNoRow
		}
		n, err := intCell(res.Record(), 0)
		if err != nil {
			return 0, err
		}
		if err := addKeyList(res.Record(), ends); err != nil {
			return 0, err
		}
		rels += n
	}
	return rels, nil
}
