package receiptlog

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/transparency-dev/formats/log"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// KeyName is the note key name checkpoints are signed under. A verifier key
// is KeyName with the key's hash; several keys (after a rotation) share it.
const KeyName = "lethe-receipt-key"

// Checkpoint is an opened, signature-checked checkpoint: the log named
// Origin had Size leaves and root Root. Note is the signed note it was read
// from, to hand to an auditor unchanged.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	Note   []byte
}

// SignCheckpoint returns the signed note of a checkpoint: the C2SP
// tlog-checkpoint body "<origin>\n<size>\n<base64 root>\n", a blank line and
// one signature line by priv under KeyName. origin must be non-empty UTF-8
// without control characters (see Origin); size must not be negative.
func SignCheckpoint(origin string, size int64, root tlog.Hash, priv ed25519.PrivateKey) ([]byte, error) {
	if !validOrigin(origin) {
		return nil, fmt.Errorf("checkpoint origin %q is empty or holds a control character", origin)
	}
	if size < 0 {
		return nil, fmt.Errorf("checkpoint size %d is negative", size)
	}
	signer, err := newSigner(priv)
	if err != nil {
		return nil, err
	}
	body := log.Checkpoint{Origin: origin, Size: uint64(size), Hash: root[:]}.Marshal()
	return note.Sign(&note.Note{Text: string(body)}, signer)
}

// newSigner makes the note signer of priv. x/mod's note has no constructor
// from an ed25519 key, so the signer key string is assembled in its
// documented form, PRIVATE+KEY+<name>+<hash>+<base64(0x01 || seed)>, with
// <name>+<hash> taken from the verifier key note itself derives for the
// public half; note.NewSigner checks the hash against the seed.
func newSigner(priv ed25519.PrivateKey) (note.Signer, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("checkpoint key is %d bytes, not an ed25519 private key", len(priv))
	}
	pub, _ := priv.Public().(ed25519.PublicKey)
	vkey, err := note.NewEd25519VerifierKey(KeyName, pub)
	if err != nil {
		return nil, err
	}
	// vkey is <name>+<hash>+<base64 key>; base64 may itself hold a '+'.
	fields := strings.SplitN(vkey, "+", 3)
	const algEd25519 = 1
	seed := append([]byte{algEd25519}, priv.Seed()...)
	return note.NewSigner("PRIVATE+KEY+" + fields[0] + "+" + fields[1] + "+" + base64.StdEncoding.EncodeToString(seed))
}

// VerifierFor returns the note verifier of pub under KeyName.
func VerifierFor(pub ed25519.PublicKey) (note.Verifier, error) {
	vkey, err := note.NewEd25519VerifierKey(KeyName, pub)
	if err != nil {
		return nil, err
	}
	return note.NewVerifier(vkey)
}

// OpenCheckpoint checks that signed carries a valid signature by one of pubs
// and parses its checkpoint body. If origin is not empty the checkpoint must
// be of that log; if it is empty any origin is accepted and returned.
// Extension lines after the root (C2SP allows them) are ignored.
//
// The error wraps ErrUnknownKey when no signature is by a given key,
// ErrBadSignature when a given key's signature does not match the text (the
// text was edited), ErrMalformed when the note or body cannot be parsed, and
// ErrWrongOrigin when the checkpoint is of another log.
func OpenCheckpoint(signed []byte, origin string, pubs ...ed25519.PublicKey) (Checkpoint, error) {
	n, err := openNote(signed, pubs)
	if err != nil {
		return Checkpoint{}, err
	}
	var body log.Checkpoint
	if _, err := body.Unmarshal([]byte(n.Text)); err != nil {
		return Checkpoint{}, fmt.Errorf("%w: body: %w", ErrMalformed, err)
	}
	if len(body.Hash) != tlog.HashSize || body.Size > math.MaxInt64 {
		return Checkpoint{}, fmt.Errorf("%w: root of %d bytes (want %d) or size %d out of range",
			ErrMalformed, len(body.Hash), tlog.HashSize, body.Size)
	}
	if origin != "" && body.Origin != origin {
		return Checkpoint{}, fmt.Errorf("%w: checkpoint is of %q, expected %q", ErrWrongOrigin, body.Origin, origin)
	}
	cp := Checkpoint{Origin: body.Origin, Size: int64(body.Size), Note: append([]byte(nil), signed...)}
	copy(cp.Root[:], body.Hash)
	return cp, nil
}

// openNote verifies signed with any of pubs and maps note's errors to ours.
func openNote(signed []byte, pubs []ed25519.PublicKey) (*note.Note, error) {
	var verifiers []note.Verifier
	seen := map[string]bool{}
	for i, pub := range pubs {
		v, err := VerifierFor(pub)
		if err != nil {
			return nil, fmt.Errorf("verifier key %d: %w", i, err)
		}
		// The same key twice would make note report an ambiguous key.
		if id := string(pub); !seen[id] {
			seen[id] = true
			verifiers = append(verifiers, v)
		}
	}
	n, err := note.Open(signed, note.VerifierList(verifiers...))
	var unverified *note.UnverifiedNoteError
	var invalid *note.InvalidSignatureError
	switch {
	case err == nil:
		return n, nil
	case errors.As(err, &unverified):
		return nil, fmt.Errorf("%w: signed only by %s, none of the %d given keys",
			ErrUnknownKey, signers(unverified.Note.UnverifiedSigs), len(verifiers))
	case errors.As(err, &invalid):
		return nil, fmt.Errorf("%w: %w: the checkpoint text was changed after signing, or the signature is corrupt", ErrBadSignature, err)
	default:
		return nil, fmt.Errorf("%w: not a signed note (text, blank line, signature lines): %w", ErrMalformed, err)
	}
}

// signers lists signatures as "<name>+<hash>" for an error message.
func signers(sigs []note.Signature) string {
	if len(sigs) == 0 {
		return "no key"
	}
	ids := make([]string, len(sigs))
	for i, s := range sigs {
		ids[i] = fmt.Sprintf("%s+%08x", s.Name, s.Hash)
	}
	return strings.Join(ids, ", ")
}

// validOrigin reports whether origin can be a checkpoint's first line and
// a signed note's text: non-empty UTF-8 without control characters.
func validOrigin(origin string) bool {
	if origin == "" || !utf8.ValidString(origin) {
		return false
	}
	return !strings.ContainsFunc(origin, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// VerifyInclusion checks that proof shows leaf (see LeafHash) at index in
// the log of cp, which must come from OpenCheckpoint. The error wraps
// ErrNotIncluded.
func VerifyInclusion(cp Checkpoint, index int64, leaf tlog.Hash, proof tlog.RecordProof) error {
	if index < 0 || index >= cp.Size {
		return fmt.Errorf("%w: index %d is outside the log of %q at size %d", ErrNotIncluded, index, cp.Origin, cp.Size)
	}
	if err := tlog.CheckRecord(proof, cp.Size, cp.Root, index, leaf); err != nil {
		return fmt.Errorf("%w: the log of %q at size %d (root %s) does not hold leaf %s at index %d: "+
			"the receipt, its index or the proof is wrong (%w)", ErrNotIncluded, cp.Origin, cp.Size, cp.Root, leaf, index, err)
	}
	return nil
}

// VerifyConsistency checks that proof shows the log of newer holding the log
// of older as its prefix: nothing was removed or changed between the two,
// only appended. Both must come from OpenCheckpoint, be of one origin, and
// older.Size <= newer.Size; checkpoints of equal size must have equal roots.
// The error wraps ErrInconsistent.
func VerifyConsistency(older, newer Checkpoint, proof tlog.TreeProof) error {
	switch {
	case older.Origin != newer.Origin:
		return fmt.Errorf("%w: they are of two logs, %q and %q", ErrInconsistent, older.Origin, newer.Origin)
	case older.Size > newer.Size:
		return fmt.Errorf("%w: the older checkpoint has size %d, the newer %d: "+
			"the log shrank, or the two are swapped", ErrInconsistent, older.Size, newer.Size)
	case older.Size == newer.Size && older.Root != newer.Root:
		return fmt.Errorf("%w: two checkpoints of size %d with different roots: "+
			"an entry was changed", ErrInconsistent, older.Size)
	case older.Size == newer.Size:
		return nil
	case older.Size == 0:
		if older.Root != emptyRoot {
			return fmt.Errorf("%w: the checkpoint of size 0 has root %s, not the empty log's",
				ErrInconsistent, older.Root)
		}
		return nil
	}
	if err := tlog.CheckTree(proof, newer.Size, newer.Root, older.Size, older.Root); err != nil {
		return fmt.Errorf("%w: the log at size %d does not contain the log at size %d: "+
			"an entry was removed or changed between the two checkpoints (%w)",
			ErrInconsistent, newer.Size, older.Size, err)
	}
	return nil
}

// emptyRoot is the root of the empty log, SHA-256 of nothing.
var emptyRoot = func() tlog.Hash {
	h, _ := tlog.TreeHash(0, nil)
	return h
}()
