package graph

import (
	"context"
	"fmt"
)

// PersonNames reads the names of the entities that also carry label (a
// store's person label), at most limit of them, for the database's names
// dictionary (lethe.redaction_names). label is admitted by the API as an
// identifier; it is checked again here because it is part of the query.
func (g *Graph) PersonNames(ctx context.Context, label string, limit int) ([]string, error) {
	q, err := quoteName(label)
	if err != nil {
		return nil, fmt.Errorf("person label: %w", err)
	}
	res, err := g.ReadQuery(ctx, "MATCH (e:`"+LabelEntity+"`:"+q+") WHERE e.name IS NOT NULL RETURN DISTINCT e.name LIMIT $n",
		map[string]any{"n": limit})
	if err != nil {
		return nil, err
	}
	cells, err := column(res)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(cells))
	for _, v := range cells {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out, nil
}
