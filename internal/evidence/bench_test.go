package evidence_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/lethe-dev/lethe/internal/benchreport"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

var benchLogRequests = flag.Int("lethe.log-requests", 10000, "receipt-log audit: signed requests in the store, each holding the checkpoint signed at its completion")

// BenchmarkReceiptLogAudit measures the receipt-log check a MemoryStore's
// audit runs (evidence.CheckLog) at P3's size: a log of n receipts and the
// n checkpoints the store's requests hold, one signed at each completion.
// The first audit in a process checks every held checkpoint (its signature
// and its consistency with the log); a later one, with the store's
// Witness, checks only the checkpoint of a completion since. The baseline
// is what every audit does whatever it holds: the log's Merkle tree.
func BenchmarkReceiptLogAudit(b *testing.B) {
	n := *benchLogRequests
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		b.Fatal(err)
	}
	key, err := evidence.ParsePrivateKey(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil {
		b.Fatal(err)
	}
	ks := keySet(b, key)
	origin := receiptlog.Origin("bench-store-uid")
	leaves := make([][32]byte, n+1)
	hashes := make([]tlog.Hash, n+1)
	for i := range leaves {
		h := receiptlog.LeafHash(evidence.LogLeaf(fmt.Sprint("uid-", i), "head", 7))
		leaves[i], hashes[i] = [32]byte(h), h
	}
	full, err := receiptlog.NewTree(hashes)
	if err != nil {
		b.Fatal(err)
	}
	held := make([][]byte, n+1)
	for i := range held {
		root, err := full.RootAt(int64(i + 1))
		if err != nil {
			b.Fatal(err)
		}
		if held[i], err = receiptlog.SignCheckpoint(origin, int64(i+1), root, priv); err != nil {
			b.Fatal(err)
		}
	}
	var tree, first, later []time.Duration
	b.ResetTimer()
	for range 5 {
		t0 := time.Now()
		if _, err := receiptlog.NewTree(hashes[:n]); err != nil {
			b.Fatal(err)
		}
		tree = append(tree, time.Since(t0))

		w := &evidence.Witness{}
		t1 := time.Now()
		checked, err := evidence.CheckLog(leaves[:n], origin, ks, held[:n], w)
		first = append(first, time.Since(t1))
		if err != nil || checked != n {
			b.Fatalf("first audit: checked %d of %d: %v", checked, n, err)
		}
		// One more completion: its receipt and the checkpoint it holds.
		t2 := time.Now()
		checked, err = evidence.CheckLog(leaves, origin, ks, held, w)
		later = append(later, time.Since(t2))
		if err != nil || checked != n+1 {
			b.Fatalf("later audit: checked %d of %d: %v", checked, n+1, err)
		}
	}
	b.StopTimer()
	// A check that passes whatever the log holds measures nothing: a log
	// with one receipt changed must be refused, first audit or later.
	changed := slices.Clone(leaves)
	changed[n/2][0] ^= 1
	if _, err := evidence.CheckLog(changed, origin, ks, held, &evidence.Witness{}); err == nil {
		b.Fatal("a log with a changed receipt passed the first audit")
	}
	setting := fmt.Sprintf("%d receipts, %d held checkpoints (one per signed request), one signing key", n, n)
	med := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, r := range []struct {
		figure string
		d      []time.Duration
	}{
		{"receipt-log check, first store audit in a process (every held checkpoint)", first},
		{"receipt-log check, a later store audit (one completion since)", later},
		{"the log's Merkle tree alone (baseline)", tree},
	} {
		benchreport.Record(b, benchreport.Row{ID: "P3", Figure: r.figure, Setting: setting, Unit: "ms", Runs: []float64{ms(med(r.d))}})
	}
	benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "receipt-log check, first store audit / the log's Merkle tree", Setting: setting, Unit: "×",
		Runs: []float64{float64(med(first)) / float64(med(tree))}})
	benchreport.Record(b, benchreport.Row{ID: "P3", Figure: "receipt-log check, later store audit / the log's Merkle tree", Setting: setting, Unit: "×",
		Runs: []float64{float64(med(later)) / float64(med(tree))}})
	b.Logf("receipt-log audit at %d: tree %v, first audit %v, later audit %v (medians of 5; first audits %v, later %v)", n, med(tree), med(first), med(later), first, later)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
