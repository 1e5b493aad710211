package controllers_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// The store's audit holds the receipt log to the checkpoints its requests
// carry between completions. A forger with the database owner's rights
// rewrites the receipt of a request whose object is gone (its data and
// hash consistent, so the leaf alone looks sound); no request completes
// afterwards, and no live request's own leaf changed, so only the audit
// can see it: ReceiptLogConsistent turns False with a Warning on the store,
// and True again once the receipt is put back.
func TestTheStoreAuditFindsAReceiptRewrittenBetweenCompletions(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "logaudit")
	first := e.request(t, "first", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA} })
	completedWithLog(t, first)
	second := e.request(t, "second", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA2} })
	completedWithLog(t, second)
	waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionTrue, lethev1.ReasonLogExtendsCheckpoints)
	if second.Status.Receipt.Log.Index <= 0 {
		t.Fatalf("the second receipt is at index %d: the first's is not under its checkpoint, the test shows nothing", second.Status.Receipt.Log.Index)
	}
	deleteAndWaitGone(t, first)

	var idx int64
	var data string
	var hash []byte
	if err := e.conn.QueryRow(ctx, `SELECT idx, leaf_data, leaf_hash FROM lethe.receipt_log WHERE request_uid = $1`, string(first.UID)).Scan(&idx, &data, &hash); err != nil {
		t.Fatal(err)
	}
	forged := evidence.LogLeaf(string(first.UID), "sha256:forged", 1)
	forgedHash := receiptlog.LeafHash(forged)
	if _, err := e.conn.Exec(ctx, `UPDATE lethe.receipt_log SET leaf_data = $2, leaf_hash = $3 WHERE idx = $1`, idx, string(forged), forgedHash[:]); err != nil {
		t.Fatal(err)
	}
	c := waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionFalse, lethev1.ReasonReceiptLogInconsistent)
	t.Logf("condition after the rewrite: %s", c.Message)
	if n := storeEvents(t, e.store, lethev1.ReasonReceiptLogInconsistent); n == 0 {
		t.Error("no ReceiptLogInconsistent Warning on the store")
	}
	if n := requestEvents(t, second, lethev1.ReasonReceiptLogInconsistent); n != 0 {
		t.Errorf("the live request reported the rewrite itself (%d events): the test does not show the audit's part", n)
	}

	if _, err := e.conn.Exec(ctx, `UPDATE lethe.receipt_log SET leaf_data = $2, leaf_hash = $3 WHERE idx = $1`, idx, data, hash); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionTrue, lethev1.ReasonLogExtendsCheckpoints)
}
