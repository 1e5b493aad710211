package controllers_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// The store's audit holds the receipt log to the checkpoints its requests
// carry between completions. A forger with the database owner's rights
// rewrites a receipt (its data and hash consistent, so the leaf alone
// looks sound), then removes the last one. No request completes meanwhile,
// and the requests' passes do not read the log again, so only the audit
// can see either: ReceiptLogConsistent turns False, with one Warning on
// the store and a message that stays the same from audit to audit, and
// True again once the log is put back.
func TestTheStoreAuditFindsAReceiptRewrittenOrRemovedBetweenCompletions(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "logaudit")
	var reqs []*lethev1.ErasureRequest
	for _, s := range []struct{ name, id string }{{"first", erasedA}, {"second", erasedA2}, {"third", keptB}} {
		er := e.request(t, s.name, func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{lethev1.SessionID(s.id)} })
		completedWithLog(t, er)
		reqs = append(reqs, er)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionTrue, lethev1.ReasonLogExtendsCheckpoints)

	type leaf struct {
		idx  int64
		uid  string
		len  int
		data string
		hash []byte
	}
	var last leaf
	if err := e.conn.QueryRow(ctx, `SELECT idx, request_uid, history_length, leaf_data, leaf_hash FROM lethe.receipt_log ORDER BY idx DESC LIMIT 1`).
		Scan(&last.idx, &last.uid, &last.len, &last.data, &last.hash); err != nil {
		t.Fatal(err)
	}
	if last.uid != string(reqs[2].UID) || reqs[2].Status.Receipt.Log.Index != last.idx {
		t.Fatalf("the log's last leaf is %d of %s, not the third request's: the test shows nothing", last.idx, last.uid)
	}
	// inconsistentThenBack waits for the audit to report the edit, checks
	// that the report holds still over several audits, undoes the edit and
	// waits for the audit to clear it.
	inconsistentThenBack := func(what, undo string, args ...any) {
		t.Helper()
		before := storeEvents(t, e.store, lethev1.ReasonReceiptLogInconsistent)
		c := waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionFalse, lethev1.ReasonReceiptLogInconsistent)
		time.Sleep(3 * storeRecheckForTests)
		again := waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionFalse, lethev1.ReasonReceiptLogInconsistent)
		if again.Message != c.Message || !again.LastTransitionTime.Equal(&c.LastTransitionTime) {
			t.Errorf("%s: the condition changed between audits: %q at %s, then %q at %s", what, c.Message, c.LastTransitionTime, again.Message, again.LastTransitionTime)
		}
		if n := storeEvents(t, e.store, lethev1.ReasonReceiptLogInconsistent) - before; n != 1 {
			t.Errorf("%s: %d ReceiptLogInconsistent Warnings on the store over several audits, want 1", what, n)
		}
		for _, er := range reqs {
			if n := requestEvents(t, er, lethev1.ReasonReceiptLogInconsistent); n != 0 {
				t.Errorf("%s: request %s reported it itself (%d events): the test does not show the audit's part", what, er.Name, n)
			}
		}
		if _, err := e.conn.Exec(ctx, undo, args...); err != nil {
			t.Fatal(err)
		}
		waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionTrue, lethev1.ReasonLogExtendsCheckpoints)
	}

	// The newest receipt rewritten: only the newest checkpoint covers it.
	forged := evidence.LogLeaf(last.uid, "sha256:forged", last.len)
	forgedHash := receiptlog.LeafHash(forged)
	if _, err := e.conn.Exec(ctx, `UPDATE lethe.receipt_log SET leaf_data = $2, leaf_hash = $3 WHERE idx = $1`, last.idx, string(forged), forgedHash[:]); err != nil {
		t.Fatal(err)
	}
	inconsistentThenBack("rewritten", `UPDATE lethe.receipt_log SET leaf_data = $2, leaf_hash = $3 WHERE idx = $1`, last.idx, last.data, last.hash)

	// The newest receipt removed: the log is shorter than that checkpoint.
	if _, err := e.conn.Exec(ctx, `DELETE FROM lethe.receipt_log WHERE idx = $1`, last.idx); err != nil {
		t.Fatal(err)
	}
	inconsistentThenBack("removed", `INSERT INTO lethe.receipt_log (idx, request_uid, history_length, leaf_data, leaf_hash) VALUES ($1, $2, $3, $4, $5)`,
		last.idx, last.uid, last.len, last.data, last.hash)
}
