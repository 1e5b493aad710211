package testenv

import (
	"context"
	"fmt"

	"github.com/lethe-dev/lethe/internal/graph"
)

// GraphElements lists every node and relationship of g as a string of its
// label or type and provenance (and an entity's key and name), with counts:
// two snapshots compare equal when the graph holds the same elements.
func GraphElements(ctx context.Context, g *graph.Graph) (map[string]int, error) {
	out := map[string]int{}
	for _, q := range []string{
		"MATCH (x) RETURN labels(x)[0] + ' ' + coalesce(x.session_id, x.id, x.key, '') + ' ' + coalesce(toString(x.id), '') + ' ' + coalesce(x.name, '')",
		"MATCH (a)-[r]->(b) RETURN type(r) + ' ' + coalesce(r.session_id, '') + ' ' + coalesce(toString(r.fact_id), '') + ' ' + coalesce(a.key, toString(a.id)) + '>' + coalesce(b.key, toString(b.id))",
	} {
		res, err := g.ReadQuery(ctx, q, nil)
		if err != nil {
			return nil, err
		}
		for res.Next() {
			v, err := res.Record().GetByIndex(0)
			if err != nil {
				return nil, err
			}
			out[fmt.Sprint(v)]++
		}
	}
	return out, nil
}
