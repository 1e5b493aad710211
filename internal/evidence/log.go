package evidence

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/mod/sumdb/tlog"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// logLeaf is what a receipt log's leaf records: that request reached a
// history head at a length. Its canonical JSON is the leaf's data.
type logLeaf struct {
	Format        string `json:"format"`
	Request       string `json:"request"`
	HistoryHead   string `json:"historyHead"`
	HistoryLength int    `json:"historyLength"`
}

// LogLeaf is the data of the receipt log's leaf for request uid at a
// history head and length (receiptlog.LeafHash hashes it).
func LogLeaf(uid, head string, length int) []byte {
	b, err := Canonical(logLeaf{Format: Format, Request: uid, HistoryHead: head, HistoryLength: length})
	if err != nil {
		panic(err) // strings and an int: cannot fail
	}
	return b
}

// verifyLog checks the receipt's inclusion proof against its signed
// checkpoint, signed by a key of the key set.
func verifyLog(rep *Report, er *lethev1.ErasureRequest, ks KeySet) error {
	r := er.Status.Receipt
	if r == nil {
		return nil
	}
	if r.Log == nil {
		rep.Unlogged = r.Envelope != "" && er.Status.EvidenceFormat != ""
		return nil
	}
	l := r.Log
	n := int(l.HistoryLength)
	if n < 1 || n > len(er.Status.History) {
		return fmt.Errorf("receipt log: the leaf records history length %d, the history has %d entries", n, len(er.Status.History))
	}
	pubs, err := ks.publicKeys()
	if err != nil {
		return err
	}
	cp, err := receiptlog.OpenCheckpoint([]byte(l.Checkpoint), "", pubs...)
	if err != nil {
		return fmt.Errorf("receipt log: %w", err)
	}
	if !strings.HasPrefix(cp.Origin, receiptlog.Origin("")) {
		return fmt.Errorf("receipt log: the checkpoint's origin %q is not a Lethe receipt log", cp.Origin)
	}
	proof, err := receiptlog.DecodeHashes(l.InclusionProof)
	if err != nil {
		return fmt.Errorf("receipt log: %w", err)
	}
	leaf := receiptlog.LeafHash(LogLeaf(string(er.UID), er.Status.History[n-1].Digest, n))
	if err := receiptlog.VerifyInclusion(cp, l.Index, leaf, proof); err != nil {
		return fmt.Errorf("receipt log: %w", err)
	}
	rep.Log = &LogCheck{Origin: cp.Origin, Index: l.Index, Size: cp.Size}
	rep.passed("the store's receipt log holds the receipt at index %d under a signed checkpoint of size %d", l.Index, cp.Size)
	return nil
}

// ErrReceiptChanged: the log holds another leaf where the database says a
// request's receipt is; only an edit of the log does that (the database
// writes each leaf from the history it checked and never changes it).
var ErrReceiptChanged = errors.New("the receipt log holds another receipt where this request's is: it was changed")

// Include builds the proof that the log of leaves holds leaf index: the
// log's checkpoint at its full size, signed by key, and the inclusion
// proof. It checks that the leaf at index is the one of request uid at the
// history head and length given (the database wrote the leaf).
//
// It signs nothing that drops or changes a receipt: the log must be
// consistent with every checkpoint in held signed by key or a key of ks
// (those the store's live requests carry); otherwise it returns an error
// naming it. w, when not nil, remembers which held checkpoints were
// checked already (see Witness).
func Include(leaves [][32]byte, index int64, uid, head string, length int, origin string, key *Key, ks KeySet, held [][]byte, w *Witness) (*lethev1.LogInclusion, error) {
	if index < 0 || index >= int64(len(leaves)) {
		return nil, fmt.Errorf("the receipt log has %d leaves, no leaf %d", len(leaves), index)
	}
	if want := receiptlog.LeafHash(LogLeaf(uid, head, length)); tlog.Hash(leaves[index]) != want {
		return nil, fmt.Errorf("leaf %d of the receipt log %s: %w", index, origin, ErrReceiptChanged)
	}
	tree, err := treeOf(leaves)
	if err != nil {
		return nil, err
	}
	pubs, err := ks.publicKeys()
	if err != nil {
		return nil, err
	}
	if _, err := w.consistent(tree, origin, append(pubs, key.pub), held); err != nil {
		return nil, err
	}
	note, err := receiptlog.SignCheckpoint(origin, tree.Size(), tree.Root(), key.priv)
	if err != nil {
		return nil, err
	}
	proof, err := tree.InclusionProof(index, tree.Size())
	if err != nil {
		return nil, err
	}
	return &lethev1.LogInclusion{Index: index, HistoryLength: int32(length), Checkpoint: string(note),
		InclusionProof: receiptlog.EncodeHashes(proof)}, nil
}

// CheckLog checks that the log of leaves extends every checkpoint in held
// signed by a key of ks (those the store's live requests carry), as
// Include does before it signs, without signing anything: a store's audit
// runs it so that a log changed or shortened behind Lethe's back is
// reported without waiting for the next completion. It returns how many
// notes of held it checked: a note no key of ks opens for this origin
// (another store's, a key not published, an edited note) is skipped, and
// the caller must not count it as held by the log. w, when not nil,
// remembers the checkpoints already checked (see Witness).
func CheckLog(leaves [][32]byte, origin string, ks KeySet, held [][]byte, w *Witness) (checked int, err error) {
	tree, err := treeOf(leaves)
	if err != nil {
		return 0, err
	}
	pubs, err := ks.publicKeys()
	if err != nil {
		return 0, err
	}
	return w.consistent(tree, origin, pubs, held)
}

// treeOf is the Merkle tree of a log's leaf hashes.
func treeOf(leaves [][32]byte) (*receiptlog.Tree, error) {
	hashes := make([]tlog.Hash, len(leaves))
	for i, l := range leaves {
		hashes[i] = tlog.Hash(l)
	}
	return receiptlog.NewTree(hashes)
}

// extends checks that tree extends the checkpoint old.
func extends(tree *receiptlog.Tree, origin string, old receiptlog.Checkpoint) error {
	now := receiptlog.Checkpoint{Origin: origin, Size: tree.Size(), Root: tree.Root()}
	if old.Size > now.Size {
		return removed(origin, now.Size, old.Size)
	}
	proof, err := tree.ConsistencyProof(old.Size, now.Size)
	if err != nil {
		return err
	}
	if err := receiptlog.VerifyConsistency(old, now, proof); err != nil {
		return fmt.Errorf("receipt log %s: %w", origin, err)
	}
	return nil
}
