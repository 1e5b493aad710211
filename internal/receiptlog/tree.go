// Package receiptlog keeps, per store, an append-only Merkle tree log of
// erasure receipts and signs checkpoints of it.
//
// Every proof of a completed erasure request written to its store's
// database is a leaf of the store's log: the canonical JSON of {format,
// historyHead, historyLength, request} (evidence.LogLeaf; the database
// computes it in lethe.record_proof). Leaves are only ever
// appended, and the log's operator signs checkpoints (origin, size, root)
// in the C2SP tlog-checkpoint format, a C2SP signed note. An auditor who kept
// two checkpoints of a store's log can ask for a consistency proof between
// them and check that no receipt was removed or changed in between, and can
// check with an inclusion proof that a given receipt is in the log.
//
// Hashing and proofs are RFC 6962 (golang.org/x/mod/sumdb/tlog), signed
// notes are golang.org/x/mod/sumdb/note with Ed25519 keys, and the checkpoint
// body is github.com/transparency-dev/formats/log. The package is pure: it
// stores nothing; callers keep the leaves and the signed checkpoints.
package receiptlog

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/mod/sumdb/tlog"
)

// Errors callers can tell apart with errors.Is. Each error returned by this
// package's checks wraps one of them, with the particulars in its message.
var (
	// ErrUnknownKey: the checkpoint carries no signature by any given key.
	ErrUnknownKey = errors.New("checkpoint not signed by a known key")
	// ErrBadSignature: a given key's signature does not match the text.
	ErrBadSignature = errors.New("checkpoint signature does not verify")
	// ErrMalformed: the signed note or the checkpoint body cannot be parsed.
	ErrMalformed = errors.New("malformed checkpoint")
	// ErrWrongOrigin: the checkpoint is of another log than the one expected.
	ErrWrongOrigin = errors.New("checkpoint of another log")
	// ErrNotIncluded: an inclusion proof does not lead to the checkpoint's root.
	ErrNotIncluded = errors.New("receipt not in the log")
	// ErrInconsistent: two checkpoints are not of one append-only log.
	ErrInconsistent = errors.New("checkpoints are not consistent")
)

// LeafHash returns the leaf hash of a receipt's leaf data in its store's
// log: the RFC 6962 leaf hash, SHA-256(0x00 || data), of the data's bytes
// exactly (evidence.LogLeaf's canonical JSON).
func LeafHash(receipt []byte) tlog.Hash {
	return tlog.RecordHash(receipt)
}

// Origin returns the checkpoint origin of a store's log. A store is named by
// its UID only, so the log reveals no store or namespace name.
func Origin(storeUID string) string {
	return "lethe.dev/receipts/" + storeUID
}

// NoteOrigin is the origin a signed checkpoint names (its first line),
// read without checking its signature: to tell which log a checkpoint is
// of before holding it against one (OpenCheckpoint checks it).
func NoteOrigin(note string) string {
	first, _, _ := strings.Cut(note, "\n")
	return first
}

// Tree is an in-memory RFC 6962 Merkle tree over a log's leaves, kept as
// tlog's stored hashes. It answers roots and proofs for every size from 0 to
// Size. A Tree is not changed after NewTree, so it is safe for concurrent use.
type Tree struct {
	size   int64
	stored []tlog.Hash // tlog.StoredHashes of every leaf, in stored-hash order
	root   tlog.Hash
}

// NewTree builds the tree whose i'th leaf is leaves[i] (see LeafHash).
func NewTree(leaves []tlog.Hash) (*Tree, error) {
	t := &Tree{stored: make([]tlog.Hash, 0, tlog.StoredHashCount(int64(len(leaves))))}
	for i, leaf := range leaves {
		hashes, err := tlog.StoredHashesForRecordHash(int64(i), leaf, t.reader())
		if err != nil {
			return nil, fmt.Errorf("add leaf %d: %w", i, err)
		}
		t.stored = append(t.stored, hashes...)
	}
	t.size = int64(len(leaves))
	root, err := tlog.TreeHash(t.size, t.reader())
	if err != nil {
		return nil, fmt.Errorf("root at size %d: %w", t.size, err)
	}
	t.root = root
	return t, nil
}

// reader reads the tree's stored hashes for tlog.
func (t *Tree) reader() tlog.HashReader {
	return tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		for i, x := range indexes {
			if x < 0 || x >= int64(len(t.stored)) {
				return nil, fmt.Errorf("stored hash %d is not computed (%d are)", x, len(t.stored))
			}
			out[i] = t.stored[x]
		}
		return out, nil
	})
}

// Size returns the number of leaves.
func (t *Tree) Size() int64 { return t.size }

// Root returns the root at the full size (SHA-256 of nothing when empty).
func (t *Tree) Root() tlog.Hash { return t.root }

// RootAt returns the root of the log's first size leaves, 0 <= size <= Size.
func (t *Tree) RootAt(size int64) (tlog.Hash, error) {
	if size < 0 || size > t.size {
		return tlog.Hash{}, fmt.Errorf("no root at size %d: the log has %d leaves", size, t.size)
	}
	return tlog.TreeHash(size, t.reader())
}

// InclusionProof returns the proof that leaf index is in the log at size,
// 0 <= index < size <= Size. VerifyInclusion checks it.
func (t *Tree) InclusionProof(index, size int64) (tlog.RecordProof, error) {
	if index < 0 || index >= size || size > t.size {
		return nil, fmt.Errorf("no inclusion proof of leaf %d at size %d: the log has %d leaves", index, size, t.size)
	}
	return tlog.ProveRecord(size, index, t.reader())
}

// ConsistencyProof returns the proof that the log at newSize holds the log
// at oldSize as its prefix, 0 <= oldSize <= newSize <= Size. The proof is
// empty when oldSize is 0 or equals newSize. VerifyConsistency checks it.
func (t *Tree) ConsistencyProof(oldSize, newSize int64) (tlog.TreeProof, error) {
	if oldSize < 0 || oldSize > newSize || newSize > t.size {
		return nil, fmt.Errorf("no consistency proof from size %d to %d: the log has %d leaves", oldSize, newSize, t.size)
	}
	if oldSize == 0 {
		return tlog.TreeProof{}, nil
	}
	return tlog.ProveTree(newSize, oldSize, t.reader())
}

// EncodeHashes writes proof hashes as text for JSON bundles: standard
// base64, one string per hash, in order. DecodeHashes reads them back.
func EncodeHashes(hashes []tlog.Hash) []string {
	out := make([]string, len(hashes))
	for i, h := range hashes {
		out[i] = h.String()
	}
	return out
}

// DecodeHashes reads hashes written by EncodeHashes. Each string must be the
// standard base64 of exactly 32 bytes; the error names the first that is not.
func DecodeHashes(texts []string) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(texts))
	for i, s := range texts {
		h, err := tlog.ParseHash(s)
		if err != nil {
			return nil, fmt.Errorf("hash %d (%q) is not base64 of 32 bytes: %w", i, s, err)
		}
		out[i] = h
	}
	return out, nil
}
