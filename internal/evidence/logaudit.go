package evidence

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// LogLeafRecord is one leaf of a receipt log as stored: its index, the
// leaf's data (LogLeaf) and hash.
type LogLeafRecord struct {
	Index int64
	Data  string
	Hash  []byte
}

// LogAudit is what AuditLog established.
type LogAudit struct {
	Size        int64
	Root        tlog.Hash
	Checkpoints int
	// Latest is the newest checkpoint that verified (the one to keep for next time).
	Latest []byte
}

// AuditLog checks a store's receipt log as an auditor: every leaf's hash
// is the hash of its data, indexes run from 0 without a gap, every
// recorded checkpoint is signed by a key of the key set, names this log
// and matches the leaves at its size, and — when the auditor holds an
// older checkpoint — the log now is consistent with it (no receipt removed
// or changed since).
func AuditLog(origin string, leaves []LogLeafRecord, checkpoints [][]byte, held []HeldCheckpoint, ks KeySet) (LogAudit, error) {
	hashes := make([]tlog.Hash, len(leaves))
	for i, l := range leaves {
		if l.Index != int64(i) {
			return LogAudit{}, fmt.Errorf("receipt log: leaf %d is stored at index %d: a leaf is missing", i, l.Index)
		}
		if len(l.Hash) != len(tlog.Hash{}) || !json.Valid([]byte(l.Data)) || receiptlog.LeafHash([]byte(l.Data)) != tlog.Hash(l.Hash) {
			return LogAudit{}, fmt.Errorf("receipt log: leaf %d's hash is not the hash of its data", i)
		}
		hashes[i] = tlog.Hash(l.Hash)
	}
	tree, err := receiptlog.NewTree(hashes)
	if err != nil {
		return LogAudit{}, err
	}
	pubs, err := ks.publicKeys()
	if err != nil {
		return LogAudit{}, err
	}
	a := LogAudit{Size: tree.Size(), Root: tree.Root()}
	for _, note := range checkpoints {
		cp, err := openAgainst(tree, note, origin, pubs)
		if err != nil {
			return a, err
		}
		a.Checkpoints++
		if cp.Size == tree.Size() {
			a.Latest = note
		}
	}
	for _, h := range held {
		if err := consistentWith(tree, h, origin, pubs, a.Latest); err != nil {
			return a, err
		}
	}
	return a, nil
}

// openAgainst verifies a recorded checkpoint and that the leaves agree with it.
func openAgainst(tree *receiptlog.Tree, note []byte, origin string, pubs []ed25519.PublicKey) (receiptlog.Checkpoint, error) {
	cp, err := receiptlog.OpenCheckpoint(note, origin, pubs...)
	if err != nil {
		return cp, fmt.Errorf("receipt log: a recorded checkpoint: %w", err)
	}
	if cp.Size > tree.Size() {
		return cp, fmt.Errorf("receipt log: a signed checkpoint has %d receipts, the log now %d: receipts were removed", cp.Size, tree.Size())
	}
	root, err := tree.RootAt(cp.Size)
	if err != nil {
		return cp, err
	}
	if root != cp.Root {
		return cp, fmt.Errorf("receipt log: the log's first %d receipts do not match its signed checkpoint of that size: a receipt was removed or changed", cp.Size)
	}
	return cp, nil
}

// HeldCheckpoint is a checkpoint kept outside the database: by the
// auditor (a file) or by a live request (its status); Source says which.
type HeldCheckpoint struct {
	Source string
	Note   []byte
}

// consistentWith checks the log against a held checkpoint, with a
// consistency proof to the latest signed checkpoint.
func consistentWith(tree *receiptlog.Tree, h HeldCheckpoint, origin string, pubs []ed25519.PublicKey, latest []byte) error {
	old, err := receiptlog.OpenCheckpoint(h.Note, origin, pubs...)
	if err != nil {
		return fmt.Errorf("receipt log: %s: %w", h.Source, err)
	}
	if latest == nil {
		return fmt.Errorf("receipt log: no signed checkpoint covers the whole log (%d receipts)", tree.Size())
	}
	newer, err := receiptlog.OpenCheckpoint(latest, origin, pubs...)
	if err != nil {
		return err
	}
	if old.Size > newer.Size {
		return fmt.Errorf("receipt log: %s has %d receipts, the log now %d: receipts were removed", h.Source, old.Size, newer.Size)
	}
	proof, err := tree.ConsistencyProof(old.Size, newer.Size)
	if err != nil {
		return err
	}
	if err := receiptlog.VerifyConsistency(old, newer, proof); err != nil {
		return fmt.Errorf("receipt log: consistency proof from %s: %w", h.Source, err)
	}
	return nil
}
