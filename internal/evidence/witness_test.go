package evidence_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// A Witness accepts exactly the logs the full check accepts: random
// sequences of completions (checkpoints handed to requests), passes that
// read the log before another pass added to it, restores to an earlier
// size, rewritten receipts and requests deleted, each step checked with
// and without the Witness.
func TestAWitnessAcceptsWhatTheFullCheckAccepts(t *testing.T) {
	key := newKey(t)
	ks := keySet(t, key)
	origin := receiptlog.Origin("store-uid")
	leafOf := func(n int) [32]byte {
		return [32]byte(receiptlog.LeafHash(evidence.LogLeaf(fmt.Sprint("uid-", n), "head", 1)))
	}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		w := &evidence.Witness{}
		var log [][32]byte
		var held [][]byte
		next := 0
		accepted, refused := 0, 0
		for step := 0; step < 150; step++ {
			switch r := rng.IntN(20); {
			case r == 0 && len(log) > 2: // restored to an earlier size, then written on
				log = append([][32]byte(nil), log[:rng.IntN(len(log)-1)+1]...)
			case r == 1 && len(log) > 1: // a receipt rewritten
				log = append([][32]byte(nil), log...)
				log[rng.IntN(len(log)-1)] = leafOf(-step)
			case r == 2 && len(held) > 0: // a request deleted: its checkpoint goes
				i := rng.IntN(len(held))
				held = append(held[:i:i], held[i+1:]...)
			}
			log = append(log, leafOf(next))
			next++
			leaves := log
			if k := rng.IntN(3) + 1; rng.IntN(4) == 0 && len(log) > k { // a pass that read the log k receipts earlier
				leaves = log[:len(log)-k]
			}
			last := leaves[len(leaves)-1]
			uid := ""
			for n := next; n >= -step-1; n-- {
				if leafOf(n) == last {
					uid = fmt.Sprint("uid-", n)
					break
				}
			}
			if uid == "" {
				continue // a rewritten receipt is last: not a completion
			}
			full, errFull := evidence.Include(leaves, int64(len(leaves)-1), uid, "head", 1, origin, key, ks, held, nil)
			incl, errW := evidence.Include(leaves, int64(len(leaves)-1), uid, "head", 1, origin, key, ks, held, w)
			if (errFull == nil) != (errW == nil) {
				t.Fatalf("seed %d step %d: full check %v, with the witness %v", seed, step, errFull, errW)
			}
			if errW != nil {
				refused++
				continue
			}
			accepted++
			if full.Checkpoint == "" || incl.Checkpoint == "" {
				t.Fatal("an accepted log without a checkpoint")
			}
			held = append(held, []byte(incl.Checkpoint))
		}
		if accepted == 0 || refused == 0 {
			t.Fatalf("seed %d: %d accepted, %d refused: the sequence does not exercise both", seed, accepted, refused)
		}
	}
}
