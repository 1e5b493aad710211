package evidence_test

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/evidence/auditref"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newKey(t testing.TB) *evidence.Key {
	t.Helper()
	k, err := evidence.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keySet(t testing.TB, keys ...*evidence.Key) evidence.KeySet {
	t.Helper()
	ks := evidence.KeySet{}
	for i, k := range keys {
		var err error
		if ks, _, err = ks.WithCurrent(k, t0.Add(time.Duration(i)*30*24*time.Hour-time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	return ks
}

// milestone records a history entry the way erasure.Record does under the format.
func milestone(t *testing.T, er *lethev1.ErasureRequest, phase lethev1.Phase, at time.Time, key *evidence.Key) {
	t.Helper()
	event(t, er, phase, "", at, key)
}

func event(t *testing.T, er *lethev1.ErasureRequest, phase lethev1.Phase, ev string, at time.Time, key *evidence.Key) {
	t.Helper()
	parts := evidence.PartsOf(er)
	d, err := evidence.CanonicalDigest(evidence.DocumentFor(er, parts, ""))
	if err != nil {
		t.Fatal(err)
	}
	c := evidence.ChainOf(er)
	c.AppendEntry(lethev1.HistoryEntry{Phase: phase, Event: ev, Time: metav1.NewTime(at), EvidenceDigest: d, EvidenceParts: parts}, key)
	er.Status.History = c.History
}

// completed is a request that went through every step, signed by key.
func completed(t *testing.T, key *evidence.Key, uid string) *lethev1.ErasureRequest {
	t.Helper()
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "forget", UID: k8stypes.UID("req-" + uid),
		CreationTimestamp: metav1.NewTime(t0)}}
	er.Spec.StoreRef.Name = "memory"
	er.Spec.SessionIDs = []lethev1.SessionID{"0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f"}
	er.Status.EvidenceFormat = evidence.Format
	er.Status.Deadline = &metav1.Time{Time: t0.AddDate(0, 1, 0)}
	er.Status.Plan = &lethev1.ErasurePlan{SessionsFound: 1, Rows: []lethev1.TableCount{{Table: "memory.rounds", Rows: 3}}, Embeddings: 3}
	milestone(t, er, lethev1.PhaseTombstoned, t0, key)
	milestone(t, er, lethev1.PhaseGracePeriod, t0.Add(time.Hour), key)
	done := metav1.NewTime(t0.Add(2 * time.Hour))
	er.Status.Evidence = &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{
		{Step: lethev1.ConditionDeleted, CompletedAt: &done, Counts: []lethev1.TableCount{{Table: "memory.rounds", Rows: 3}},
			Verification: []lethev1.Verification{{Check: "rows referencing sessions in memory.rounds", Found: 0}}},
		{Step: lethev1.ConditionBackupsRotated, Backups: []lethev1.BackupEvidence{{Name: "nightly-1", Expiration: &done, GoneAt: &done}}},
	}}
	milestone(t, er, lethev1.PhaseDeleted, done.Time, key)
	milestone(t, er, lethev1.PhaseBackupsRotated, done.Add(time.Hour), key)
	er.Status.Phase = lethev1.PhaseBackupsRotated
	r, err := evidence.Issue(context.Background(), er, key, done.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	er.Status.Receipt = r
	return er
}

func verify(er *lethev1.ErasureRequest, ks evidence.KeySet) error {
	_, err := evidence.VerifyRequest(context.Background(), er, evidence.Options{KeySet: ks})
	return err
}

func TestSignedRequestVerifies(t *testing.T) {
	key := newKey(t)
	er := completed(t, key, "a")
	rep, err := evidence.VerifyRequest(context.Background(), er, evidence.Options{KeySet: keySet(t, key)})
	if err != nil {
		t.Fatalf("a genuine request does not verify: %v", err)
	}
	if rep.Unsigned || rep.InProgress || rep.Receipt == nil || !rep.Receipt.Signed || rep.Receipt.Covers != 4 || len(rep.SignedBy) != 1 {
		t.Fatalf("report %+v", rep)
	}
	for _, e := range er.Status.History {
		if e.KeyID != key.ID() || e.Signature == "" {
			t.Fatalf("entry not signed: %+v", e)
		}
	}
	pred := rep.Receipt.Predicate
	if pred.RequestedAt != "2026-11-29T12:00:00Z" || pred.Deadline != "2026-12-29T12:00:00Z" || len(pred.Milestones) != 4 ||
		pred.Steps[0].Counts["memory.rounds"] != 3 || pred.Backups.Gone != 1 || pred.Lethe["version"] == "" {
		t.Fatalf("the statement lacks what an auditor needs: %+v", pred)
	}
	// A later entry (a Resurrected re-verification) keeps the receipt valid.
	milestone(t, er, lethev1.PhaseBackupsRotated, t0.Add(5*time.Hour), key)
	if err := verify(er, keySet(t, key)); err != nil {
		t.Fatalf("a later history entry broke the receipt: %v", err)
	}
}

// TestTamperingIsNamed: each edit an adversary with status write could
// make fails verification with a message naming it.
func TestTamperingIsNamed(t *testing.T) {
	key, other := newKey(t), newKey(t)
	ks := keySet(t, key)
	for name, tc := range map[string]struct {
		tamper func(er *lethev1.ErasureRequest)
		want   string
	}{
		"edited evidence count": {func(er *lethev1.ErasureRequest) { er.Status.Evidence.Steps[0].Counts[0].Rows = 30 },
			"evidence of step Deleted was edited"},
		"edited verification result": {func(er *lethev1.ErasureRequest) { er.Status.Evidence.Steps[0].Verification[0].Found = 2 },
			"evidence of step Deleted was edited"},
		"edited backup list": {func(er *lethev1.ErasureRequest) { er.Status.Evidence.Steps[1].Backups = nil },
			"evidence of step BackupsRotated was edited"},
		"removed step evidence": {func(er *lethev1.ErasureRequest) { er.Status.Evidence.Steps = er.Status.Evidence.Steps[:1] },
			"evidence of step BackupsRotated was removed"},
		"edited plan":       {func(er *lethev1.ErasureRequest) { er.Status.Plan.SessionsFound = 7 }, "status.plan was edited"},
		"edited session ID": {func(er *lethev1.ErasureRequest) { er.Spec.SessionIDs[0] = "11111111-3d2a-4c8e-9f10-2a6b7c8d9e0f" }, "spec.sessionIDs edited"},
		"appended entry signed by a key outside the set": {func(er *lethev1.ErasureRequest) {
			milestone(t, er, lethev1.PhaseBackupsRotated, t0.Add(9*time.Hour), other)
		}, "entry 4 does not verify: key"},
		"appended unsigned entry": {func(er *lethev1.ErasureRequest) {
			milestone(t, er, lethev1.PhaseBackupsRotated, t0.Add(9*time.Hour), nil)
		}, "entry 4 does not verify: the entry is unsigned"},
		"entry signature replaced": {func(er *lethev1.ErasureRequest) { er.Status.History[2].Signature = er.Status.History[1].Signature },
			"entry 2 does not verify: the signature does not verify"},
		"swapped receipt": {func(er *lethev1.ErasureRequest) { er.Status.Receipt = completed(t, key, "b").Status.Receipt },
			"which no history entry has"},
		"unsigned receipt":                  {func(er *lethev1.ErasureRequest) { er.Status.Receipt.Envelope = "" }, "receipt: unsigned"},
		"chain copied onto another request": {func(er *lethev1.ErasureRequest) { er.UID = "req-other" }, "entry 0 does not verify"},
		"renamed request":                   {func(er *lethev1.ErasureRequest) { er.Name = "forget-bob" }, "not this request"},
		"moved deadline": {func(er *lethev1.ErasureRequest) { er.Status.Deadline.Time = er.Status.Deadline.AddDate(0, 1, 0) },
			"deadline"},
		"moved requestedAt": {func(er *lethev1.ErasureRequest) { er.CreationTimestamp.Time = er.CreationTimestamp.AddDate(0, -1, 0) },
			"requested"},
		"removed receipt": {func(er *lethev1.ErasureRequest) { er.Status.Receipt = nil }, "has no receipt"},
		"moved receipt issuedAt": {func(er *lethev1.ErasureRequest) {
			er.Status.Receipt.IssuedAt.Time = er.Status.Receipt.IssuedAt.AddDate(0, -1, 0)
		}, "status.receipt.issuedAt"},
		"removed receipt and phase set back": {func(er *lethev1.ErasureRequest) {
			er.Status.Receipt, er.Status.Phase = nil, lethev1.PhaseDeleted
			er.Status.Evidence.Steps[0].Counts[0].Rows = 30
		}, "evidence of step Deleted was edited"},
		"emptied history": {func(er *lethev1.ErasureRequest) { er.Status.History = nil }, "no history"},
		"laundered through a later signed entry": {func(er *lethev1.ErasureRequest) {
			// The count edited while the backups rotate, then signed by
			// the next entry (as a manager that did not check would).
			er.Status.Evidence.Steps[0].Counts[0].Rows = 30
			milestone(t, er, lethev1.PhaseBackupsRotated, t0.Add(9*time.Hour), key)
		}, "history entry 4 changed settled evidence: evidence of step Deleted was edited"},
		"duplicate step hiding the real one": {func(er *lethev1.ErasureRequest) {
			fake := er.Status.Evidence.Steps[0]
			fake.Counts = []lethev1.TableCount{{Table: "memory.rounds", Rows: 99}}
			er.Status.Evidence.Steps = append([]lethev1.StepEvidence{fake}, er.Status.Evidence.Steps...)
		}, "step Deleted twice"},
		"a step named plan": {func(er *lethev1.ErasureRequest) {
			er.Status.Evidence.Steps = append(er.Status.Evidence.Steps, lethev1.StepEvidence{Step: "plan"})
		}, "never writes"},
		"reordered entries": {func(er *lethev1.ErasureRequest) {
			h := er.Status.History
			h[1], h[2] = h[2], h[1]
		}, "entry 1 does not verify"},
	} {
		t.Run(name, func(t *testing.T) {
			er := completed(t, key, "a")
			tc.tamper(er)
			err := verify(er, ks)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestOldReceiptVerifiesAfterKeyRotation(t *testing.T) {
	oldKey, newer := newKey(t), newKey(t)
	er := completed(t, oldKey, "a")
	// Thirty days later the key is replaced: the set keeps the old one, retired.
	ks := keySet(t, oldKey, newer)
	if ks.Keys[0].ValidUntil == nil || ks.Keys[1].ValidUntil != nil {
		t.Fatalf("rotation did not retire the old key: %+v", ks)
	}
	if err := verify(er, ks); err != nil {
		t.Fatalf("an old receipt fails after a key rotation: %v", err)
	}
	// A request completed after the rotation, signed by the new key, verifies too.
	// An entry the retired key signed after its retirement does not: the key may have leaked.
	milestone(t, er, lethev1.PhaseBackupsRotated, t0.Add(40*24*time.Hour), oldKey)
	err := verify(er, ks)
	if err == nil || !strings.Contains(err.Error(), "outside the period it was current") {
		t.Fatalf("a retired key's late signature: %v", err)
	}
}

// The anonymous receipt (kept in the database, naming the request by UID
// only) signed the same dates as the named one: a request with its name
// and namespace cleared and that receipt put in is still held to them, and
// a bundle never holds a request without a name.
func TestAnonymousReceiptStillBindsTheDates(t *testing.T) {
	key := newKey(t)
	ks := keySet(t, key)
	er := completed(t, key, "a")
	anon := er.DeepCopy()
	anon.Name, anon.Namespace = "", ""
	r, err := evidence.Issue(context.Background(), anon, key, er.Status.Receipt.IssuedAt.Time)
	if err != nil {
		t.Fatal(err)
	}
	anon.Status.Receipt = r
	if err := verify(anon, ks); err != nil {
		t.Fatalf("the anonymous receipt of an unedited request: %v", err)
	}
	for name, edit := range map[string]func(*lethev1.ErasureRequest){
		"deadline":  func(f *lethev1.ErasureRequest) { f.Status.Deadline.Time = f.Status.Deadline.AddDate(0, 1, 0) },
		"requested": func(f *lethev1.ErasureRequest) { f.CreationTimestamp.Time = f.CreationTimestamp.AddDate(0, 0, 20) },
	} {
		f := anon.DeepCopy()
		edit(f)
		if err := verify(f, ks); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s edited under the anonymous receipt: %v, want an error naming it", name, err)
		}
	}
	raw, err := json.Marshal(evidence.NewBundle(anon, ks, "test", t0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evidence.ReadBundle(raw); err == nil || !strings.Contains(err.Error(), "no name or namespace") {
		t.Errorf("a bundle whose request has no name: %v, want it refused", err)
	}
}

func TestBundleVerifiesAndPinsKeys(t *testing.T) {
	key := newKey(t)
	er := completed(t, key, "a")
	raw, err := json.Marshal(evidence.NewBundle(er, keySet(t, key), "test", t0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := evidence.ReadBundle(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evidence.VerifyBundle(context.Background(), b, nil, false); err != nil {
		t.Fatalf("bundle: %v", err)
	}
	// A bundle whose key set was swapped for a forger's verifies only
	// against itself: pinning the auditor's key set catches it.
	forger := newKey(t)
	forged := completed(t, forger, "a")
	fb := evidence.NewBundle(forged, keySet(t, forger), "test", t0)
	if _, err := evidence.VerifyBundle(context.Background(), fb, nil, false); err != nil {
		t.Fatalf("self-consistent forged bundle: %v", err)
	}
	pinned := keySet(t, key)
	if _, err := evidence.VerifyBundle(context.Background(), fb, &pinned, false); err == nil || !strings.Contains(err.Error(), "not in the key set") {
		t.Fatalf("forged bundle against the pinned key set: %v", err)
	}
}

// TestDigestsRecomputeIndependently holds the format's digests against the
// hand-written reference (auditref), from the request's JSON.
func TestDigestsRecomputeIndependently(t *testing.T) {
	er := completed(t, newKey(t), "a")
	er.Status.Evidence.Steps[0].Note = `probed <8> "embeddings" & 1 table` + "\n\u00e9\u2028"
	milestone(t, er, lethev1.PhaseBackupsRotated, t0.Add(5*time.Hour), nil)
	raw, err := json.Marshal(er)
	if err != nil {
		t.Fatal(err)
	}
	res, err := auditref.Recompute(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.EntryDigests) != len(er.Status.History) {
		t.Fatalf("%d digests for %d entries", len(res.EntryDigests), len(er.Status.History))
	}
	for i, e := range er.Status.History {
		if res.EntryDigests[i] != e.Digest || res.EntryEvidenceDigests[i] != e.EvidenceDigest {
			t.Errorf("entry %d: reference %s / %s, Lethe %s / %s", i, res.EntryDigests[i], res.EntryEvidenceDigests[i], e.Digest, e.EvidenceDigest)
		}
	}
	last := er.Status.History[len(er.Status.History)-1]
	if res.EvidenceDigest != last.EvidenceDigest || !maps.Equal(res.Parts, last.EvidenceParts) {
		t.Errorf("evidence as it stands: reference %s %v, Lethe %s %v", res.EvidenceDigest, res.Parts, last.EvidenceDigest, last.EvidenceParts)
	}
	if want := string(evidence.LogLeaf(string(er.UID), last.Digest, len(er.Status.History))); res.LogLeaf != want {
		t.Errorf("log leaf: reference %s, Lethe %s", res.LogLeaf, want)
	}
}

// A request still running verifies as far as it got, says it is in
// progress, and is not a complete proof; the manager's own check
// (Unchanged) refuses evidence edited since its entry.
func TestInProgressAndUnchanged(t *testing.T) {
	key := newKey(t)
	er := completed(t, key, "a")
	er.Status.History, er.Status.Receipt, er.Status.Phase = er.Status.History[:3], nil, lethev1.PhaseDeleted
	// The backup step is progressing: its evidence changes without an entry.
	er.Status.Evidence.Steps[1].Backups[0].GoneAt = nil
	rep, err := evidence.VerifyRequest(context.Background(), er, evidence.Options{KeySet: keySet(t, key)})
	if err != nil || !rep.InProgress || rep.Complete() {
		t.Fatalf("in progress: %v, report %+v", err, rep)
	}
	if err := evidence.Unchanged(er, lethev1.ConditionBackupsRotated); err != nil {
		t.Fatalf("a step in progress is not tampering: %v", err)
	}
	// Evidence of a step the request is not on, with no entry for it: added by someone else.
	fake := er.DeepCopy()
	fake.Status.Evidence.Steps = append(fake.Status.Evidence.Steps, lethev1.StepEvidence{Step: lethev1.ReasonResurrected})
	if err := evidence.Unchanged(fake, lethev1.ConditionBackupsRotated); err == nil || !strings.Contains(err.Error(), "appeared without a history entry") {
		t.Fatalf("an added step: %v", err)
	}
	dup := er.DeepCopy()
	dup.Status.Evidence.Steps = append([]lethev1.StepEvidence{{Step: lethev1.ConditionDeleted}}, dup.Status.Evidence.Steps...)
	if err := evidence.Unchanged(dup, lethev1.ConditionBackupsRotated); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a step twice: %v", err)
	}
	er.Status.Evidence.Steps[0].Verification[0].Found = 1
	if err := evidence.Unchanged(er, lethev1.ConditionBackupsRotated); err == nil || !strings.Contains(err.Error(), "evidence of step Deleted was edited") {
		t.Fatalf("an edit of settled evidence: %v", err)
	}
}

// A bundle that another JSON tool would read differently is refused: a
// duplicate key, a key in another case, a field this version does not know.
func TestBundleReadsTheSameToEveryTool(t *testing.T) {
	raw, err := json.Marshal(evidence.NewBundle(completed(t, newKey(t), "a"), evidence.KeySet{}, "test", t0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evidence.ReadBundle(raw); err != nil {
		t.Fatalf("an exported bundle: %v", err)
	}
	for name, edit := range map[string]func(string) string{
		"duplicate key":       func(s string) string { return strings.Replace(s, `"found":0`, `"found":0,"found":3`, 1) },
		"key in another case": func(s string) string { return strings.Replace(s, `"found":0`, `"found":0,"Found":3`, 1) },
		"unknown field":       func(s string) string { return strings.Replace(s, `"found":0`, `"found":0,"foundLater":3`, 1) },
		"explicit empty": func(s string) string {
			return strings.Replace(s, `"sessionsFound":1`, `"sessionsFound":1,"graphNodes":0`, 1)
		},
	} {
		edited := edit(string(raw))
		if edited == string(raw) {
			t.Fatalf("%s: the edit did not apply", name)
		}
		if _, err := evidence.ReadBundle([]byte(edited)); err == nil {
			t.Errorf("%s: the bundle was accepted", name)
		}
	}
}
