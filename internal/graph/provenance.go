package graph

// Provenance is an application ID Lethe can check against Postgres: a
// relationship's session_id or fact_id, a Session's id, a Fact's id or
// session_id, another node's session_id. An Entity has none of its own: it
// is attested by the relationships with provenance that touch it. An element
// without provenance attests nothing, so it never keeps an erased entity
// alive; but with nothing tying it to erased data, Lethe does not delete it
// for that alone either: the sweep counts it and it stays, unless all it
// was attached to is erased.

// withoutProvenance holds for a relationship u that carries neither
// session_id nor fact_id.
const withoutProvenance = "u.session_id IS NULL AND u.fact_id IS NULL"

// withProvenance holds for a relationship q that carries either.
const withProvenance = "q.session_id IS NOT NULL OR q.fact_id IS NOT NULL"

// attestsOutside holds, per provenance property being erased, for a
// relationship q whose provenance lies outside $ids: it keeps its entity.
// A relationship without provenance never does.
var attestsOutside = map[string]string{
	// A fact_id without session_id is checked by the sweep against the
	// facts; until then it counts as another session's.
	propSessionID: "(q.session_id IS NOT NULL AND NOT q.session_id IN $ids) OR (q.session_id IS NULL AND q.fact_id IS NOT NULL)",
	// A fact of a surviving session may go on its own: its relationships
	// go with it, whatever their session_id.
	propFactID: "(q.session_id IS NOT NULL OR q.fact_id IS NOT NULL) AND (q.fact_id IS NULL OR NOT q.fact_id IN $ids)",
}

// doomedEntities matches, as e, the entities touched by a relationship r
// whose prop (session_id or fact_id) is in $ids and which no relationship
// with provenance outside $ids touches: once those go, nothing attests
// the entity. Relationships without provenance do not count.
//
// pat is a directed pattern around (e), "()-[r:T]->(e)" or "(e)-[r:T]->()".
// The shape works around three behaviours of FalkorDB 4.16.3: an undirected
// pattern driven by a relationship index misses matches; a label check on
// (e) anywhere before an aggregation turns the index scan into a scan of
// every node (0.5 s instead of 2 ms on 130k elements); and collecting the
// nodes themselves in a query that deletes left other nodes' attributes
// unreadable ("Attempted to access undefined attribute", then a crash).
// So the endpoints' keys (application IDs) are collected and the entities
// found again by key.
func doomedEntities(pat, prop string) string {
	return "MATCH " + pat + " WHERE r." + prop + " IN $ids\nWITH collect(DISTINCT e.key) AS keys\n" + othersIn("keys", prop) + "WHERE others = 0\n"
}

// othersIn matches, as e with its key k, the entities whose key is in the
// list keys (an expression), with others: 1 when a relationship with
// provenance outside $ids (for prop) touches them, 0 when none does.
func othersIn(keys, prop string) string {
	return "UNWIND " + keys + " AS k\nMATCH (e:`" + LabelEntity + "` {key: k})\n" + anyRelationship(attestsOutside[prop], "others") + "WITH k, e, others\n"
}

// anyRelationship binds, as name, 1 when a relationship q of the entity e
// meets cond and 0 when none does. Only existence matters to every caller:
// the subquery stops at the first match, where a count read every
// relationship of the entity (an entity named by many facts has hundreds;
// on the 1M-element graph of P5 the counts were a third of a prune).
func anyRelationship(cond, name string) string {
	return "CALL { WITH e OPTIONAL MATCH (e)-[q]-() WHERE " + cond + " WITH q LIMIT 1 RETURN count(q) AS " + name + " }\n"
}
