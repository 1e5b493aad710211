package history

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// receiptLogObs is a run's store's receipt log at the end of its round
// (the runs share one database; each store has its own log in it) and
// what holds it to account: the checkpoints its requests' final statuses
// carry and its store's ReceiptLogConsistent condition.
type receiptLogObs struct {
	Leaves    [][32]byte
	Origin    string
	Held      [][]byte
	Condition *metav1.Condition
}

// receiptLogLeaves reads the leaf hashes of the log origin by index: the
// leaves written before migration 00023 (none here), then its own.
func receiptLogLeaves(ctx context.Context, conn *pgx.Conn, origin string) ([][32]byte, error) {
	rows, err := conn.Query(ctx, `SELECT leaf_hash FROM lethe.receipt_log WHERE origin IN ('', $1) ORDER BY idx`, origin)
	if err != nil {
		return nil, fmt.Errorf("read the receipt log: %w", err)
	}
	hashes, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("read the receipt log: %w", err)
	}
	out := make([][32]byte, len(hashes))
	for i, h := range hashes {
		if len(h) != 32 {
			return nil, fmt.Errorf("receipt log leaf %d is %d bytes", i, len(h))
		}
		out[i] = [32]byte(h)
	}
	return out, nil
}

// storeLogs reads the receipt log of each run's store, by its origin.
func storeLogs(ctx context.Context, e *env, conn *pgx.Conn, plans []*runPlan) (map[*runPlan]*receiptLogObs, error) {
	out := map[*runPlan]*receiptLogObs{}
	for _, p := range plans {
		store := &lethev1.MemoryStore{}
		if err := e.k8s.Get(ctx, keyOf(p.NS, "memory"), store); err != nil {
			return nil, err
		}
		o := &receiptLogObs{Origin: receiptlog.Origin(string(store.UID))}
		var err error
		if o.Leaves, err = receiptLogLeaves(ctx, conn, o.Origin); err != nil {
			return nil, err
		}
		out[p] = o
	}
	return out, nil
}

// observeReceiptLog adds to the run's store's log (storeLogs) its
// condition and the checkpoints of its requests' final states.
func observeReceiptLog(ctx context.Context, e *env, p *runPlan, o *receiptLogObs, final map[string]*lethev1.ErasureRequest) (*receiptLogObs, error) {
	store := &lethev1.MemoryStore{}
	if err := e.k8s.Get(ctx, keyOf(p.NS, "memory"), store); err != nil {
		return nil, err
	}
	if o == nil || o.Origin != receiptlog.Origin(string(store.UID)) {
		return nil, fmt.Errorf("run %s: its store's log was not read, or its store was created again since", p.NS)
	}
	o.Condition = meta.FindStatusCondition(store.Status.Conditions, lethev1.MemoryStoreReceiptLogConsistent)
	for _, r := range p.Requests {
		if er := final[r.Name]; er != nil && er.Status.Receipt != nil && er.Status.Receipt.Log != nil {
			o.Held = append(o.Held, []byte(er.Status.Receipt.Log.Checkpoint))
		}
	}
	return o, nil
}

// receiptLog checks, in a round without a restore, that the log kills,
// dropped connections and concurrent completions left it extends every
// checkpoint the run's requests hold (the log is append-only, so nothing
// else may), that every one of them opens with a published key, and that
// the store's audit does not say otherwise. A restore takes receipts back
// by design; its round is not held to this.
func (c *checker) receiptLog() {
	if c.rec.Restore != nil {
		return
	}
	o := c.rec.ReceiptLog
	if o == nil {
		c.bad("no receipt log was recorded")
		return
	}
	checked, err := evidence.CheckLog(o.Leaves, o.Origin, c.rec.KeySet, o.Held, nil)
	switch {
	case err != nil:
		c.bad("the receipt log (%d leaves) does not extend a checkpoint the run's requests hold, in a round without a restore: %v", len(o.Leaves), err)
	case checked != len(o.Held):
		c.bad("%d of the %d checkpoints the run's requests hold open with no published key for the store's log", len(o.Held)-checked, len(o.Held))
	}
	if o.Condition != nil && o.Condition.Status == metav1.ConditionFalse {
		c.bad("the store reports ReceiptLogConsistent False (%s) in a round without a restore", o.Condition.Reason)
	}
}
