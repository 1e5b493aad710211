package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

// A restore of the memory database (a real pg_dump, then a real drop and
// pg_restore) takes back a receipt whose checkpoint a live request holds:
// the second request's. It erases again, and its longer proof goes into
// the database, but the log now holds another receipt where the held
// checkpoint had the second's, so Lethe signs no checkpoint of it. That is
// the store's standing state, not a failed mirror: the proof is in the
// database, no pass says it is not, a request completing meanwhile is done
// without an inclusion, and deleting the second request is not held up.
// Once no live request holds the checkpoint the log does not extend, the
// store's audit says the log is consistent again and the request left
// without an inclusion gets one; the auditor's check of the store passes.
func TestARestoredReceiptLogWithholdsInclusionsWithoutFailingMirrors(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "logrestore")
	db := databaseOf(t, e.dsn)
	only := func(id string) func(*lethev1.ErasureRequest) {
		return func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{lethev1.SessionID(id)} }
	}
	first := e.request(t, "first", only(erasedA))
	completedWithLog(t, first)
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, dump); err != nil {
		t.Fatal(err)
	}
	second := e.request(t, "second", only(erasedA2))
	completedWithLog(t, second)
	if second.Status.Receipt.Log.Index != 1 {
		t.Fatalf("the second receipt is at index %d of the log, want 1: the test shows nothing", second.Status.Receipt.Log.Index)
	}

	restoreDump(t, e, db, dump)
	waitHistoryEntry(t, second, string(lethev1.PhaseBackupsRotated)+"/"+lethev1.ReasonResurrected)
	waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionFalse, lethev1.ReasonReceiptLogInconsistent)
	proofLength := func(er *lethev1.ErasureRequest) int64 {
		return e.count(t, `SELECT coalesce(max(history_count), 0) FROM lethe.erasure_proofs WHERE request_uid = $1`, string(er.UID))
	}
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(second), second); err != nil {
			return err
		}
		if got, want := proofLength(second), int64(len(second.Status.History)); got != want {
			return fmt.Errorf("the database holds the second proof with %d history entries, want %d", got, want)
		}
		if requestEvents(t, second, controllers.ReasonReceiptLogInconsistent) == 0 {
			return errors.New("no ReceiptLogInconsistent event on the second request")
		}
		return nil
	})
	if l := second.Status.Receipt.Log; l == nil || int(l.HistoryLength) == len(second.Status.History) {
		t.Fatalf("the second request's inclusion %+v covers its history after the restore: a checkpoint of the forked log was signed", l)
	}

	// A request completing meanwhile: mirrored, no inclusion, no failure.
	third := e.request(t, "third", only(keptB))
	waitPhase(t, third, lethev1.PhaseBackupsRotated)
	eventually(t, 30*time.Second, func() error {
		if got, want := proofLength(third), int64(len(third.Status.History)); got != want {
			return fmt.Errorf("the database holds the third proof with %d history entries, want %d", got, want)
		}
		if requestEvents(t, third, controllers.ReasonReceiptLogInconsistent) == 0 {
			return errors.New("no ReceiptLogInconsistent event on the third request")
		}
		return nil
	})
	// Passes come every second here (ReverifyInterval): a mirror counted
	// as failed would say so in each of them.
	nudge(t, second, third)
	time.Sleep(5 * time.Second)
	for _, er := range []*lethev1.ErasureRequest{second, third} {
		if n := requestEvents(t, er, controllers.ReasonProofNotMirrored); n != 0 {
			t.Errorf("request %s: %d ProofNotMirrored events, though its proof is in the database", er.Name, n)
		}
		if n := requestEvents(t, er, controllers.ReasonReceiptLogInconsistent); n != 1 {
			t.Errorf("request %s: %d ReceiptLogInconsistent events, want 1", er.Name, n)
		}
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(third), third); err != nil || third.Status.Receipt.Log != nil {
		t.Fatalf("the forked log was signed for the third request: %v %+v", err, third.Status.Receipt)
	}

	// Deleting the request that holds the checkpoint the log no longer
	// extends is not held up, and its proof stays in the database.
	deleteAndWaitGone(t, second)
	if got, want := proofLength(second), int64(len(second.Status.History)); got != want {
		t.Errorf("after the second request went, the database holds its proof with %d history entries, want %d", got, want)
	}
	waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionTrue, lethev1.ReasonLogExtendsCheckpoints)
	completedWithLog(t, third)
	if out, err := kubectlErasure(t, e.ns, "receipts", "--store", e.store.Name); err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("receipts after the log was signed again: %v\n%s", err, out)
	}
}

// A restore to between a request's deletion and its completion (a Backup
// still expiring held it there) takes back its proof and its receipt, but
// no erasure: the sessions were gone and the ledger rows there when the
// dump was taken, so the store's audit finds nothing to erase again. The
// request's own passes find the database without its proof and write it
// again, the same receipt at the same place in the log, though this process
// had mirrored it; deleting the request afterwards leaves it there.
func TestAProofARestoreTookBackIsMirroredAgain(t *testing.T) {
	ctx := context.Background()
	ve := newVeleroEnv(t, "restore-proof")
	db := databaseOf(t, ve.dsn)
	ve.backup(t, "nightly", ve.app, 90*day)
	er := ve.request(t, "forget", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.GracePeriod = &metav1.Duration{Duration: time.Millisecond}
	})
	waitStepReason(t, er, lethev1.ConditionBackupsRotated, lethev1.ReasonBackupsExpiring)
	if n := ve.count(t, `SELECT count(*) FROM lethe.erasure_proofs WHERE request_uid = $1`, string(er.UID)); n != 0 {
		t.Fatalf("%d proofs of the request before it completed: the dump would hold it, and the test shows nothing", n)
	}
	dump := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, dump); err != nil {
		t.Fatal(err)
	}
	ve.deleteWithVelero(t, "nightly")
	completedWithLog(t, er)
	held := func() (proofs, leaves int64) {
		return ve.count(t, `SELECT count(*) FROM lethe.erasure_proofs WHERE request_uid = $1 AND history_count = $2`, string(er.UID), len(er.Status.History)),
			ve.count(t, `SELECT count(*) FROM lethe.receipt_log WHERE request_uid = $1 AND history_length = $2 AND idx = $3`,
				string(er.UID), len(er.Status.History), er.Status.Receipt.Log.Index)
	}
	eventually(t, 30*time.Second, func() error {
		if p, l := held(); p != 1 || l != 1 {
			return fmt.Errorf("%d proofs and %d leaves of the request in the database, want 1 and 1", p, l)
		}
		return nil
	})
	history := len(er.Status.History)

	restoreDump(t, ve.memoryEnv, db, dump)
	eventually(t, 30*time.Second, func() error {
		if p, l := held(); p != 1 || l != 1 {
			return fmt.Errorf("%d proofs and %d leaves of the request in the database after the restore, want it written again", p, l)
		}
		return nil
	})
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
		t.Fatal(err)
	}
	if len(er.Status.History) != history {
		t.Fatalf("the history grew from %d to %d entries: the restore was read as lost erasure, and the test shows nothing", history, len(er.Status.History))
	}
	deleteAndWaitGone(t, er)
	if p, l := held(); p != 1 || l != 1 {
		t.Errorf("%d proofs and %d leaves of the request in the database once it went, want 1 and 1", p, l)
	}
}
