package receiptlog_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/lethe-dev/lethe/internal/receiptlog"
)

const storeUID = "3f2b6c1e-8a4d-4e0f-9b7a-2c5d1e6f7a80"

// receipts returns n distinct receipt bodies.
func receipts(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, `{"payloadType":"application/vnd.in-toto+json","payload":"r%d","signatures":[]}`, i)
	}
	return out
}

func leaves(rs [][]byte) []tlog.Hash {
	out := make([]tlog.Hash, len(rs))
	for i, r := range rs {
		out[i] = receiptlog.LeafHash(r)
	}
	return out
}

func tree(t *testing.T, ls []tlog.Hash) *receiptlog.Tree {
	t.Helper()
	tr, err := receiptlog.NewTree(ls)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// mth is RFC 6962's Merkle Tree Hash (section 2.1), written out here
// independently of tlog.
func mth(d [][]byte) [32]byte {
	switch n := len(d); n {
	case 0:
		return sha256.Sum256(nil)
	case 1:
		return sha256.Sum256(append([]byte{0x00}, d[0]...))
	default:
		k := 1
		for k*2 < n {
			k *= 2
		}
		l, r := mth(d[:k]), mth(d[k:])
		return sha256.Sum256(append(append([]byte{0x01}, l[:]...), r[:]...))
	}
}

func TestRootsAreRFC6962(t *testing.T) {
	rs := receipts(33)
	full := tree(t, leaves(rs))
	for n := 0; n <= len(rs); n++ {
		want := tlog.Hash(mth(rs[:n]))
		if got := tree(t, leaves(rs[:n])).Root(); got != want {
			t.Errorf("size %d: root %s, RFC 6962 gives %s", n, got, want)
		}
		if got, err := full.RootAt(int64(n)); err != nil || got != want {
			t.Errorf("size %d of 33: root %s (%v), RFC 6962 gives %s", n, got, err, want)
		}
	}
	if _, err := full.RootAt(34); err == nil {
		t.Error("a root past the log's size was given")
	}
}

func TestInclusionProofs(t *testing.T) {
	rs := receipts(33)
	ls := leaves(rs)
	tr := tree(t, ls)
	for _, size := range []int64{1, 2, 3, 5, 8, 13, 32, 33} {
		root, err := tr.RootAt(size)
		if err != nil {
			t.Fatal(err)
		}
		cp := receiptlog.Checkpoint{Origin: receiptlog.Origin(storeUID), Size: size, Root: root}
		for i := range size {
			proof := inclusionProof(t, tr, i, size)
			if err := receiptlog.VerifyInclusion(cp, i, ls[i], proof); err != nil {
				t.Errorf("size %d index %d: %v", size, i, err)
			}
			wrongLeaf := receiptlog.LeafHash([]byte("a receipt never logged"))
			if err := receiptlog.VerifyInclusion(cp, i, wrongLeaf, proof); !errors.Is(err, receiptlog.ErrNotIncluded) {
				t.Errorf("size %d index %d: wrong leaf accepted (%v)", size, i, err)
			}
			if size > 1 {
				other := (i + 1) % size
				if err := receiptlog.VerifyInclusion(cp, other, ls[i], proof); !errors.Is(err, receiptlog.ErrNotIncluded) {
					t.Errorf("size %d: leaf %d accepted at index %d (%v)", size, i, other, err)
				}
			}
		}
		if err := receiptlog.VerifyInclusion(cp, size, ls[0], nil); !errors.Is(err, receiptlog.ErrNotIncluded) {
			t.Errorf("size %d: an index past the end was accepted (%v)", size, err)
		}
	}
	if _, err := tr.InclusionProof(5, 5); err == nil {
		t.Error("an inclusion proof of an index past the size was given")
	}
}

// inclusionProof also sends the proof through its JSON text form.
func inclusionProof(t *testing.T, tr *receiptlog.Tree, index, size int64) tlog.RecordProof {
	t.Helper()
	p, err := tr.InclusionProof(index, size)
	if err != nil {
		t.Fatal(err)
	}
	back, err := receiptlog.DecodeHashes(receiptlog.EncodeHashes(p))
	if err != nil {
		t.Fatal(err)
	}
	return back
}

func checkpoints(t *testing.T, tr *receiptlog.Tree) []receiptlog.Checkpoint {
	t.Helper()
	out := make([]receiptlog.Checkpoint, tr.Size()+1)
	for n := range out {
		root, err := tr.RootAt(int64(n))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = receiptlog.Checkpoint{Origin: receiptlog.Origin(storeUID), Size: int64(n), Root: root}
	}
	return out
}

func TestConsistencyProofs(t *testing.T) {
	tr := tree(t, leaves(receipts(20)))
	cps := checkpoints(t, tr)
	for m := range int64(21) {
		for n := m; n <= 20; n++ {
			p, err := tr.ConsistencyProof(m, n)
			if err != nil {
				t.Fatal(err)
			}
			if err := receiptlog.VerifyConsistency(cps[m], cps[n], p); err != nil {
				t.Errorf("%d -> %d: %v", m, n, err)
			}
		}
	}
	if _, err := tr.ConsistencyProof(3, 21); err == nil {
		t.Error("a consistency proof past the log's size was given")
	}
}

// The operator rebuilds the log without receipt k and appends a new one, so
// it keeps its size; no proof it can give links it to a checkpoint taken
// before. Same for a receipt replaced in place.
func TestRemovedOrReplacedReceiptIsDetected(t *testing.T) {
	rs := receipts(12)
	honest := checkpoints(t, tree(t, leaves(rs)))
	for k := range len(rs) {
		removed := append(append(append([][]byte{}, rs[:k]...), rs[k+1:]...), []byte("appended after"))
		replaced := append([][]byte{}, rs...)
		replaced[k] = []byte("a forged receipt")
		for name, forged := range map[string][][]byte{"removed": removed, "replaced": replaced} {
			ft := tree(t, leaves(forged))
			now := checkpoints(t, ft)[ft.Size()]
			for m := k + 1; m < len(honest); m++ {
				p, err := ft.ConsistencyProof(int64(m), ft.Size())
				if err != nil {
					t.Fatal(err)
				}
				err = receiptlog.VerifyConsistency(honest[m], now, p)
				if !errors.Is(err, receiptlog.ErrInconsistent) {
					t.Errorf("receipt %d %s, checkpoint at %d: %v", k, name, m, err)
				}
			}
		}
	}
}

func TestConsistencyRefusals(t *testing.T) {
	cps := checkpoints(t, tree(t, leaves(receipts(4))))
	other := checkpoints(t, tree(t, leaves(receipts(5)[1:])))
	otherStore := cps[4]
	otherStore.Origin = receiptlog.Origin("another-uid")
	for name, c := range map[string][2]receiptlog.Checkpoint{
		"older larger":          {cps[4], cps[3]},
		"same size other root":  {cps[4], other[4]},
		"other store":           {cps[2], otherStore},
		"empty with a root":     {{Origin: cps[0].Origin, Root: cps[4].Root}, cps[4]},
		"proof of another tree": {cps[2], other[4]},
	} {
		if err := receiptlog.VerifyConsistency(c[0], c[1], nil); !errors.Is(err, receiptlog.ErrInconsistent) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func keys(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestCheckpointRoundTrip(t *testing.T) {
	pub, priv := keys(t)
	oldPub, _ := keys(t)
	tr := tree(t, leaves(receipts(7)))
	origin := receiptlog.Origin(storeUID)
	signed, err := receiptlog.SignCheckpoint(origin, tr.Size(), tr.Root(), priv)
	if err != nil {
		t.Fatal(err)
	}
	text := origin + "\n7\n" + base64.StdEncoding.EncodeToString(rootBytes(tr.Root())) + "\n"
	if !strings.HasPrefix(string(signed), text+"\n— "+receiptlog.KeyName+" ") || strings.Count(string(signed), "\n— ") != 1 {
		t.Fatalf("signed note is not the C2SP checkpoint %q with one signature:\n%s", text, signed)
	}
	for _, pubs := range [][]ed25519.PublicKey{{pub}, {oldPub, pub}, {pub, pub}} {
		cp, err := receiptlog.OpenCheckpoint(signed, origin, pubs...)
		if err != nil {
			t.Fatal(err)
		}
		if cp.Origin != origin || cp.Size != 7 || cp.Root != tr.Root() || !bytes.Equal(cp.Note, signed) {
			t.Errorf("opened %+v", cp)
		}
	}
	cp, err := receiptlog.OpenCheckpoint(signed, "", pub)
	if err != nil || cp.Origin != origin {
		t.Errorf("any origin: %+v, %v", cp, err)
	}
	v, err := receiptlog.VerifierFor(pub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := note.Open(signed, note.VerifierList(v)); err != nil {
		t.Errorf("the note does not open with the verifier of its key: %v", err)
	}
}

// A note verifier key is <name>+<hash>+<base64 key>, and base64 may hold a
// '+': signing must work for every key, not only most.
func TestSignWithKeysWhoseBase64HoldsAPlus(t *testing.T) {
	plus := 0
	for i := range 64 {
		priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{byte(i)}, ed25519.SeedSize))
		pub, _ := priv.Public().(ed25519.PublicKey)
		vkey, err := note.NewEd25519VerifierKey(receiptlog.KeyName, pub)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(strings.SplitN(vkey, "+", 3)[2], "+") {
			plus++
		}
		signed, err := receiptlog.SignCheckpoint(receiptlog.Origin(storeUID), 1, tlog.Hash{}, priv)
		if err != nil {
			t.Fatalf("seed %d (%s): %v", i, vkey, err)
		}
		if _, err := receiptlog.OpenCheckpoint(signed, "", pub); err != nil {
			t.Fatalf("seed %d (%s): %v", i, vkey, err)
		}
	}
	if plus == 0 {
		t.Fatal("no key had a '+' in its base64: the test covers nothing")
	}
}

func TestCheckpointRefusals(t *testing.T) {
	pub, priv := keys(t)
	otherPub, _ := keys(t)
	origin := receiptlog.Origin(storeUID)
	root := receiptlog.LeafHash([]byte("r"))
	signed, err := receiptlog.SignCheckpoint(origin, 7, root, priv)
	if err != nil {
		t.Fatal(err)
	}
	rawPub, signRaw := rawSigner(t)
	cases := map[string]struct {
		note   []byte
		origin string
		key    ed25519.PublicKey
		want   error
	}{
		"other key":     {signed, origin, otherPub, receiptlog.ErrUnknownKey},
		"edited size":   {bytes.Replace(signed, []byte("\n7\n"), []byte("\n6\n"), 1), origin, pub, receiptlog.ErrBadSignature},
		"wrong origin":  {signed, receiptlog.Origin("another-uid"), pub, receiptlog.ErrWrongOrigin},
		"unsigned":      {[]byte(origin + "\n7\n" + root.String() + "\n"), origin, pub, receiptlog.ErrMalformed},
		"body not C2SP": {signRaw("just one line\n"), "", rawPub, receiptlog.ErrMalformed},
		"short root":    {signRaw(origin + "\n7\nAAAA\n"), origin, rawPub, receiptlog.ErrMalformed},
	}
	for name, c := range cases {
		if _, err := receiptlog.OpenCheckpoint(c.note, c.origin, c.key); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
	if _, err := receiptlog.OpenCheckpoint(signed, origin, pub); err != nil {
		t.Errorf("the untouched note no longer opens: %v", err)
	}
	if _, err := receiptlog.SignCheckpoint("two\nlines", 1, root, priv); err == nil {
		t.Error("an origin with a newline was signed")
	}
}

// rawSigner returns a key named KeyName made by note itself, and a function
// signing any text with it: notes whose body is not a checkpoint.
func rawSigner(t *testing.T) (ed25519.PublicKey, func(text string) []byte) {
	t.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, receiptlog.KeyName)
	if err != nil {
		t.Fatal(err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.SplitN(vkey, "+", 3)[2])
	if err != nil {
		t.Fatal(err)
	}
	return ed25519.PublicKey(raw[1:]), func(text string) []byte {
		msg, err := note.Sign(&note.Note{Text: text}, s)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
}

func TestDecodeHashesRefusesBadText(t *testing.T) {
	good := receiptlog.LeafHash([]byte("r")).String()
	for _, in := range [][]string{{good, "not base64!"}, {"AAAA"}, {good + "AAAA"}} {
		if _, err := receiptlog.DecodeHashes(in); err == nil {
			t.Errorf("%q decoded", in)
		}
	}
}

func rootBytes(h tlog.Hash) []byte { return h[:] }
