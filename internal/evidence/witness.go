package evidence

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// Witness remembers, for one receipt log, the held checkpoints already
// found consistent with it, so that a completion checks only the
// checkpoints it has not seen, not every checkpoint the store's requests
// hold (thousands, each a signature check).
//
// Consistency is transitive: a checkpoint consistent with the largest tree
// the Witness accepted (its anchor) holds for every tree that extends the
// anchor, and, when its size fits, for every tree the anchor extends (a
// pass that read the log before another pass added to it). When a tree is
// neither (a restored or rewritten log), the Witness forgets everything
// and checks every held checkpoint again: it never accepts a tree the
// full check refuses. The zero value is ready; a nil *Witness checks every
// held checkpoint each time.
type Witness struct {
	mu      sync.Mutex
	origin  string
	anchor  *receiptlog.Tree
	checked map[[32]byte]int64 // sha256 of a held note -> its size
}

// consistent checks the tree against the checkpoints in held signed by one
// of pubs; notes that open with none of them (another store's, another
// key's) are not this log's to hold and are skipped. It returns how many
// notes of held it checked (opened now or checked before).
func (w *Witness) consistent(tree *receiptlog.Tree, origin string, pubs []ed25519.PublicKey, held [][]byte) (int, error) {
	if w == nil {
		opened, err := checkAll(tree, origin, pubs, held)
		return countIn(held, opened), err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.agrees(tree, origin) {
		w.origin, w.anchor, w.checked = origin, nil, map[[32]byte]int64{}
	}
	var unseen [][]byte
	for _, note := range held {
		size, ok := w.checked[sha256.Sum256(note)]
		if !ok {
			unseen = append(unseen, note)
			continue
		}
		if size > tree.Size() {
			return 0, removed(origin, tree.Size(), size)
		}
	}
	opened, err := checkAll(tree, origin, pubs, unseen)
	if err != nil {
		return 0, err
	}
	for h, size := range opened {
		w.checked[h] = size
	}
	if w.anchor == nil || tree.Size() >= w.anchor.Size() {
		w.anchor = tree
	}
	return len(held) - len(unseen) + countIn(unseen, opened), nil
}

// countIn counts the notes of held that opened has.
func countIn(held [][]byte, opened map[[32]byte]int64) int {
	n := 0
	for _, note := range held {
		if _, ok := opened[sha256.Sum256(note)]; ok {
			n++
		}
	}
	return n
}

// agrees says whether tree and the anchor are one log: one extends the other.
func (w *Witness) agrees(tree *receiptlog.Tree, origin string) bool {
	if w.anchor == nil || w.origin != origin {
		return false
	}
	if tree.Size() >= w.anchor.Size() {
		return extends(tree, origin, receiptlog.Checkpoint{Origin: origin, Size: w.anchor.Size(), Root: w.anchor.Root()}) == nil
	}
	root, err := w.anchor.RootAt(tree.Size())
	return err == nil && root == tree.Root()
}

// checkAll checks the tree against each note in held that opens with one of
// pubs, and returns those it opened (sha256 of the note -> size); a note
// that opens with none is left out: a key published later may open it.
func checkAll(tree *receiptlog.Tree, origin string, pubs []ed25519.PublicKey, held [][]byte) (map[[32]byte]int64, error) {
	opened := map[[32]byte]int64{}
	for _, note := range held {
		old, err := receiptlog.OpenCheckpoint(note, origin, pubs...)
		if err != nil {
			continue
		}
		if err := extends(tree, origin, old); err != nil {
			return nil, err
		}
		opened[sha256.Sum256(note)] = old.Size
	}
	return opened, nil
}

// removed is the error for a log smaller than a checkpoint Lethe signed;
// like every log that does not extend a checkpoint, it wraps
// receiptlog.ErrInconsistent.
func removed(origin string, size, signed int64) error {
	return fmt.Errorf("receipt log %s has %d receipts, fewer than the %d of a checkpoint Lethe signed: receipts were removed (%w)",
		origin, size, signed, receiptlog.ErrInconsistent)
}
