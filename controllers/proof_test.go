package controllers_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// A completed request's signed receipt and history are mirrored into the
// database it erased from: after the request object is deleted, an auditor
// reads them there and verifies them with the published key, and an edited
// history fails.
func TestProofOutlivesTheRequestObject(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "proof")
	er := e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	assertSignedReceipt(t, er)
	deleteAndWaitGone(t, er)

	var digest, envelope, keyID, format string
	var raw, doc []byte
	if err := e.conn.QueryRow(ctx, `SELECT digest, envelope, key_id, history, evidence_format, document FROM lethe.erasure_proofs WHERE request_uid = $1`, string(er.UID)).
		Scan(&digest, &envelope, &keyID, &raw, &format, &doc); err != nil {
		t.Fatalf("no proof of the deleted request in the database: %v", err)
	}
	var history []lethev1.HistoryEntry
	if err := json.Unmarshal(raw, &history); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(er.Status.History, history); diff != "" {
		t.Fatalf("mirrored history differs from the request's (-request +database):\n%s", diff)
	}
	// The database is outside the request's namespace: its receipt names
	// the request by UID only.
	var env struct{ Payload string }
	if err := json.Unmarshal([]byte(envelope), &env); err != nil {
		t.Fatal(err)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(payload), string(er.UID)) || strings.Contains(string(payload), er.Name) || strings.Contains(string(payload), er.Namespace) {
		t.Fatalf("the mirrored statement does not name the request by UID only: %s", payload)
	}
	// The auditor has the database's row and the published key set, not
	// the object: the chain, signatures, receipt and evidence all verify.
	receipt := &lethev1.Receipt{Digest: digest, Envelope: envelope, KeyID: keyID}
	fromDB, sessions, err := evidence.RequestFromProof(string(er.UID), format, history, receipt, doc)
	if err != nil {
		t.Fatal(err)
	}
	ks := publishedKeySet(t)
	opts := evidence.Options{KeySet: ks, SessionsDigest: sessions}
	rep, err := evidence.VerifyRequest(ctx, fromDB, opts)
	if err != nil {
		t.Fatalf("the proof read from the database does not verify: %v", err)
	}
	if rep.Receipt == nil || !rep.Receipt.Signed || rep.Receipt.Covers != len(history) {
		t.Fatalf("the database's receipt: %+v", rep.Receipt)
	}
	edited := fromDB.DeepCopy()
	for i := range edited.Status.Evidence.Steps {
		if st := &edited.Status.Evidence.Steps[i]; st.Step == lethev1.ConditionDeleted {
			st.Counts[0].Rows++
		}
	}
	if _, err := evidence.VerifyRequest(ctx, edited, opts); err == nil || !strings.Contains(err.Error(), "evidence of step Deleted was edited") {
		t.Fatalf("an edited count in the database's evidence: %v", err)
	}
	fromDB.Status.History[len(history)-1].Time = metav1.NewTime(history[len(history)-1].Time.Add(time.Hour))
	if _, err := evidence.VerifyRequest(ctx, fromDB, opts); err == nil {
		t.Fatal("an edited history from the database verifies")
	}
}

// The status write that records the receipt's inclusion in the store's log
// fails once (a conflict): the next pass records it again, though this
// process mirrored the proof already.
func TestALostLogInclusionIsRecordedAgain(t *testing.T) {
	e := newMemoryEnv(t, "log-lost")
	lostStatusWrites.failLogOnce(e.ns)
	er := e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	assertSignedReceipt(t, er)
}

// The pass that completes a request mirrors its proof right after its
// status write holds, not a later pass: in production the next pass is the
// hourly recheck, and the proof would wait that long for the database.
func TestTheCompletingPassMirrorsTheProof(t *testing.T) {
	e := newMemoryEnv(t, "mirror-pass")
	w := &mirrorWatch{}
	mirrorWatches.Store(e.ns, w)
	t.Cleanup(func() { mirrorWatches.Delete(e.ns) })
	er := e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	eventually(t, 30*time.Second, func() error {
		if mirrored, _ := w.first(); !mirrored {
			return errors.New("the proof is not mirrored yet")
		}
		return nil
	})
	if _, later := w.first(); later {
		t.Fatal("the proof was first mirrored by a pass that began with the receipt in the API server, not by the pass that completed the request")
	}
	if n := e.count(t, `SELECT count(*) FROM lethe.erasure_proofs WHERE request_uid = $1`, string(er.UID)); n != 1 {
		t.Fatalf("%d proofs of the request in the database, want 1", n)
	}
}
