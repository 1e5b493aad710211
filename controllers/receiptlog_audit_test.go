package controllers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// The store's audit holds the receipt log to the checkpoints its requests
// carry between completions. A forger with the database owner's rights
// rewrites the last receipt (its data and hash consistent, so the leaf
// alone looks sound). No request completes meanwhile: ReceiptLogConsistent
// turns False, with one Warning on the store and a message that stays the
// same from audit to audit, and True again once the log is put back. The
// request whose receipt it was finds it too (its passes check that the
// database holds its proof): it says that its receipt was changed, and
// that the database lost the proof it wrote; no other request says
// anything. Then the forger removes that receipt: the request writes it
// again, the same leaf at the same index (its second ProofLost Warning
// joins the first's series).
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
		log  string
		idx  int64
		uid  string
		len  int
		data string
		hash []byte
	}
	var last leaf
	if err := e.conn.QueryRow(ctx, `SELECT origin, idx, request_uid, history_length, leaf_data, leaf_hash FROM lethe.receipt_log ORDER BY idx DESC LIMIT 1`).
		Scan(&last.log, &last.idx, &last.uid, &last.len, &last.data, &last.hash); err != nil {
		t.Fatal(err)
	}
	if last.uid != string(reqs[2].UID) || reqs[2].Status.Receipt.Log.Index != last.idx || last.log != receiptlog.Origin(string(e.store.UID)) {
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
		for i, er := range reqs {
			want := 0
			if i == 2 {
				want = 1
			}
			if n := requestEvents(t, er, controllers.ReasonReceiptChanged); n != want {
				t.Errorf("%s: request %s said %d times (event objects) that its receipt was changed, want %d", what, er.Name, n, want)
			}
			if n := requestEvents(t, er, controllers.ReasonProofLost); n != want {
				t.Errorf("%s: request %s said %d times that the database lost its proof, want %d", what, er.Name, n, want)
			}
			if n := requestEvents(t, er, lethev1.ReasonReceiptLogInconsistent); n != 0 {
				t.Errorf("%s: request %s took a changed receipt for a withheld inclusion (%d events)", what, er.Name, n)
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

	// The newest receipt removed: its request writes it again.
	if _, err := e.conn.Exec(ctx, `DELETE FROM lethe.receipt_log WHERE origin = $1 AND idx = $2`, last.log, last.idx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		back := e.count(t, `SELECT count(*) FROM lethe.receipt_log WHERE origin = $1 AND idx = $2 AND request_uid = $3 AND leaf_hash = $4`,
			last.log, last.idx, last.uid, last.hash)
		if back != 1 {
			return errors.New("the removed receipt is not written again, as it was")
		}
		return nil
	})
	waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionTrue, lethev1.ReasonLogExtendsCheckpoints)
	if n := e.count(t, `SELECT count(*) FROM lethe.receipt_log WHERE origin = $1`, last.log); n != last.idx+1 {
		t.Errorf("the log has %d leaves once written again, want %d", n, last.idx+1)
	}
}
