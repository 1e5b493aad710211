package erasurecli

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// The auditor's check of store a, whose log starts with the leaves stores
// a and b shared before migration 00023: a leaf there may be of a request
// of b's that went on in b's own log (its proof's history is longer and
// its last leaf is in b's log). The leaf still records a prefix of that
// proof, which is read for it; the proof's last leaf is not looked for in
// a's log. A proof of a's own (or from before 00023) missing its last leaf
// is still refused.
func TestTheAuditOfAStoreTakesTheSharedPrefixOfALogWhoseRequestWentOn(t *testing.T) {
	key, err := evidence.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	ks, _, err := evidence.KeySet{}.WithCurrent(key, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	storeA := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{UID: "store-a"}}
	originA, originB := receiptlog.Origin("store-a"), receiptlog.Origin("store-b")
	chain := func(uid string, n int) []lethev1.HistoryEntry {
		c := evidence.Chain{Format: evidence.Format, Request: uid}
		for i := range n {
			c.Append(lethev1.PhaseBackupsRotated, "", time.Date(2026, 11, 30, i, 0, 0, 0, time.UTC), "sha256:aa", key)
		}
		return c.History
	}
	a1, b1 := chain("uid-a1", 1), chain("uid-b1", 2)
	// a's log: a1, then b1 at its first length (the shared prefix).
	var recs []postgres.LogRecord
	var hashes [][32]byte
	for i, l := range []struct {
		uid string
		h   []lethev1.HistoryEntry
		n   int
	}{{"uid-a1", a1, 1}, {"uid-b1", b1, 1}} {
		data := evidence.LogLeaf(l.uid, l.h[l.n-1].Digest, l.n)
		hash := receiptlog.LeafHash(data)
		recs = append(recs, postgres.LogRecord{Index: int64(i), RequestUID: l.uid, HistoryLength: l.n, LeafData: string(data), LeafHash: hash[:]})
		hashes = append(hashes, [32]byte(hash))
	}
	incl, err := evidence.Include(hashes, 1, "uid-b1", b1[0].Digest, 1, originA, key, ks, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cps := []postgres.StoredCheckpoint{{Size: 2, Note: incl.Checkpoint}}
	proofs := []erasure.Proof{
		{UID: "uid-a1", History: a1, Format: evidence.Format, Log: originA},
		{UID: "uid-b1", History: b1, Format: evidence.Format, Log: originB},
	}
	if _, err := auditStoreLog(storeA, recs, cps, proofs, nil, ks); err != nil {
		t.Fatalf("store a's audit with a shared-prefix leaf of a request that went on in b's log: %v", err)
	}
	for name, log := range map[string]string{"store a's own": originA, "from before 00023": ""} {
		proofs[1].Log = log
		if _, err := auditStoreLog(storeA, recs, cps, proofs, nil, ks); err == nil || !strings.Contains(err.Error(), "has no leaf") {
			t.Errorf("a proof %s without its last leaf in the log: %v, want it refused", name, err)
		}
	}
}
