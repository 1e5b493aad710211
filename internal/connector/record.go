package connector

import (
	"context"
	"slices"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// graphPruneLimit bounds the graph elements one delete query removes when a
// recorded erasure is repeated (the requests' own steps use their flags).
const graphPruneLimit = 10000

// SourceHashes lists the keyed source hashes the request uid holds in the
// store's ledger, and the key their rows say they are under, for the
// store's record.
func (c *Connector) SourceHashes(ctx context.Context, store *lethev1.MemoryStore, uid string) ([]string, string, error) {
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return nil, "", err
	}
	return ledger.SourceHashes(ctx, uid)
}

// UnderOtherKeys counts the requests whose keyed ledger rows are under
// another erasure key than the store's database has.
func (c *Connector) UnderOtherKeys(ctx context.Context, store *lethev1.MemoryStore) (int64, error) {
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return 0, err
	}
	return ledger.UnderOtherKeys(ctx)
}

// CheckRecorded reports the recorded requests whose erasure the store's
// database no longer holds in full.
func (c *Connector) CheckRecorded(ctx context.Context, store *lethev1.MemoryStore, recs []erasure.Recorded) ([]erasure.RestoreFinding, error) {
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return nil, err
	}
	return ledger.CheckRecorded(ctx, recs)
}

// ReeraseRecorded repeats a recorded erasure whose request object is gone:
// it finds the sessions the record names (match), erases them again with
// their ledger rows, puts the recorded source rows back and prunes what the
// graph holds of them. The result counts the sessions erased and the ledger
// rows written (sessions and sources).
func (c *Connector) ReeraseRecorded(ctx context.Context, store *lethev1.MemoryStore, rec erasure.Recorded,
	match func(sessionID string) bool) (erasure.BatchResult, error) {
	var res erasure.BatchResult
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return res, err
	}
	back, err := ledger.MatchSessions(ctx, match)
	if err != nil {
		return res, err
	}
	if len(back) > 0 {
		if res, err = ledger.Reerase(ctx, erasure.Request{UID: rec.UID, SessionIDs: back}); err != nil {
			return res, err
		}
	}
	if err := ledger.RecordErasedElsewhere(ctx, rec.UID, match); err != nil {
		return res, err
	}
	n, err := ledger.RestoreSources(ctx, rec.UID, rec.Sources, rec.SourcesKey)
	if err != nil {
		return res, err
	}
	res.LedgerRowsRestored += n
	return res, c.PruneGraph(ctx, store, back)
}

// PruneGraph removes what the store's graph holds only of the given erased
// sessions (nothing when the store has no graph).
func (c *Connector) PruneGraph(ctx context.Context, store *lethev1.MemoryStore, sessionIDs []string) error {
	if store.Spec.FalkorDB == nil || len(sessionIDs) == 0 {
		return nil
	}
	g, err := c.Graph(ctx, store)
	if err != nil {
		return err
	}
	for chunk := range slices.Chunk(sessionIDs, 100) {
		if _, err := g.Prune(ctx, chunk, graphPruneLimit); err != nil {
			return err
		}
	}
	return nil
}

// RestoreSources puts back the recorded source rows of rec that the
// store's ledger lacks; it returns how many it wrote.
func (c *Connector) RestoreSources(ctx context.Context, store *lethev1.MemoryStore, rec erasure.Recorded) (int64, error) {
	ledger, err := c.Ledger(ctx, store)
	if err != nil {
		return 0, err
	}
	return ledger.RestoreSources(ctx, rec.UID, rec.Sources, rec.SourcesKey)
}
