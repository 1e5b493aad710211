package evidence_test

import (
	"errors"
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
		w, audit := &evidence.Witness{}, &evidence.Witness{}
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
			// The manager tells a log that does not extend a held checkpoint
			// from a check that could not run by this error alone.
			for _, err := range []error{errFull, errW} {
				if err != nil && !errors.Is(err, receiptlog.ErrInconsistent) {
					t.Fatalf("seed %d step %d: refused with %v, which is not receiptlog.ErrInconsistent", seed, step, err)
				}
			}
			// A store's audit checks the same log without signing: it must
			// refuse exactly what Include refuses, with or without its own
			// Witness.
			for _, aw := range []*evidence.Witness{nil, audit} {
				n, err := evidence.CheckLog(leaves, origin, ks, held, aw)
				if (err == nil) != (errFull == nil) || (err != nil && !errors.Is(err, receiptlog.ErrInconsistent)) {
					t.Fatalf("seed %d step %d: Include %v, CheckLog (witness %t) %v", seed, step, errFull, aw != nil, err)
				}
				if err == nil && n != len(held) {
					t.Fatalf("seed %d step %d: CheckLog (witness %t) checked %d of %d held checkpoints, all signed by the key", seed, step, aw != nil, n, len(held))
				}
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

// CheckLog skips a held checkpoint no key of the key set opens (another
// store's, or a key published later) and refuses a log shortened below,
// or changed within, one it opens.
func TestCheckLogHoldsTheLogToTheCheckpointsItCanOpen(t *testing.T) {
	key, other := newKey(t), newKey(t)
	ks := keySet(t, key)
	origin := receiptlog.Origin("store-uid")
	var log [][32]byte
	for n := range 4 {
		log = append(log, [32]byte(receiptlog.LeafHash(evidence.LogLeaf(fmt.Sprint("uid-", n), "head", 1))))
	}
	signed := func(k *evidence.Key, ks evidence.KeySet) []byte {
		incl, err := evidence.Include(log, 3, "uid-3", "head", 1, origin, k, ks, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return []byte(incl.Checkpoint)
	}
	held := [][]byte{signed(key, ks)}
	check := func(log [][32]byte, held [][]byte) (int, error) {
		return evidence.CheckLog(log, origin, ks, held, nil)
	}
	if n, err := check(log, held); err != nil || n != 1 {
		t.Fatalf("the log its checkpoint was signed over: %d checked, %v", n, err)
	}
	if n, err := check(append(log, log[0]), held); err != nil || n != 1 {
		t.Fatalf("the log grown by a receipt: %d checked, %v", n, err)
	}
	if _, err := check(log[:3], held); err == nil {
		t.Error("a log shortened below a held checkpoint passed")
	}
	changed := append([][32]byte(nil), log...)
	changed[1] = changed[2]
	if _, err := check(changed, held); err == nil {
		t.Error("a log with a receipt changed under a held checkpoint passed")
	}
	// Skipped, and said so: the caller must not count it as held by the log.
	if n, err := check(log[:3], [][]byte{signed(other, keySet(t, other))}); err != nil || n != 0 {
		t.Errorf("a checkpoint no published key opens: %d checked, %v; want 0 and no error", n, err)
	}
}
