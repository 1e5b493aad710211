package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/receiptlog"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// logFixture signs checkpoints of receipt logs as the manager does.
type logFixture struct {
	t   *testing.T
	key *evidence.Key
	ks  evidence.KeySet
}

func newLogFixture(t *testing.T) logFixture {
	t.Helper()
	key := signingKey(t)
	ks, _, err := evidence.KeySet{}.WithCurrent(key, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	return logFixture{t: t, key: key, ks: ks}
}

// proof is a proof of request uid of n entries, into the log of store.
func (f logFixture) proof(uid, store string, n int) erasure.Proof {
	p := proofOf(f.t, uid, n, f.key)
	p.Log = receiptlog.Origin(store)
	return p
}

// sign checks the log of leaves against held, as a completion does, and
// returns the checkpoint of the whole log, naming the last leaf as p's.
func (f logFixture) sign(leaves [][32]byte, p erasure.Proof, held ...[]byte) []byte {
	f.t.Helper()
	n := len(p.History)
	incl, err := evidence.Include(leaves, int64(len(leaves)-1), p.UID, p.History[n-1].Digest, n, p.Log, f.key, f.ks, held, nil)
	if err != nil {
		f.t.Fatalf("sign the log of %s at %d leaves: %v", p.Log, len(leaves), err)
	}
	return []byte(incl.Checkpoint)
}

// audit checks the log of origin as an auditor does (kubectl erasure
// receipts): its leaves, recorded checkpoints and proofs, and held.
func (f logFixture) audit(e *postgres.Eraser, origin string, held ...[]byte) (evidence.LogAudit, []string) {
	f.t.Helper()
	ctx := context.Background()
	recs, cps, err := e.ReadLog(ctx, origin)
	if err != nil {
		f.t.Fatal(err)
	}
	leaves := make([]evidence.LogLeafRecord, len(recs))
	for i, r := range recs {
		leaves[i] = evidence.LogLeafRecord{Index: r.Index, Data: r.LeafData, Hash: r.LeafHash}
	}
	notes := make([][]byte, len(cps))
	for i, c := range cps {
		notes[i] = []byte(c.Note)
	}
	var hs []evidence.HeldCheckpoint
	for _, h := range held {
		hs = append(hs, evidence.HeldCheckpoint{Source: "a request's status", Note: h})
	}
	a, err := evidence.AuditLog(origin, leaves, notes, hs, f.ks)
	if err != nil {
		f.t.Fatalf("audit of %s: %v", origin, err)
	}
	proofs, err := e.ReadProofs(ctx, origin)
	if err != nil {
		f.t.Fatal(err)
	}
	var uids []string
	for _, p := range proofs {
		uids = append(uids, p.UID)
	}
	slices.Sort(uids)
	return a, uids
}

// Two stores sharing one database (one MemoryStore per tenant) each have
// their own receipt log: their leaves interleave in time but not in the
// logs, each log's indexes run from 0, a checkpoint of each is kept at the
// same size, and an auditor of either store reads its own log, checkpoints
// and proofs only, and verifies them. A request whose store was created
// again (a new UID: a new log) goes on in the new store's log. A proof
// without a log, or with one that is not a store's, is refused.
func TestStoresSharingADatabaseEachHaveTheirOwnReceiptLog(t *testing.T) {
	ctx := context.Background()
	dsn, _, e := managerEraser(t)
	f := newLogFixture(t)
	mirror := func(p erasure.Proof, want int64) {
		t.Helper()
		if idx, err := e.MirrorProof(ctx, p); err != nil || idx != want {
			t.Fatalf("mirror %s into %s: leaf %d, %v; want leaf %d", p.UID, p.Log, idx, err, want)
		}
	}
	a1, b1, a2 := f.proof("uid-a1", "store-a", 1), f.proof("uid-b1", "store-b", 1), f.proof("uid-a2", "store-a", 1)
	mirror(a1, 0)
	mirror(b1, 0)
	mirror(a2, 1)
	logOf := func(p erasure.Proof) [][32]byte {
		t.Helper()
		leaves, err := e.ReceiptLog(ctx, p.Log)
		if err != nil {
			t.Fatal(err)
		}
		return leaves
	}
	if a, b := logOf(a1), logOf(b1); len(a) != 2 || len(b) != 1 {
		t.Fatalf("store a's log has %d leaves, store b's %d; want 2 and 1", len(a), len(b))
	}
	// Each store signs its log at size 1; both checkpoints are kept.
	heldA := f.sign(logOf(a1)[:1], a1)
	heldB := f.sign(logOf(b1), b1)
	for _, cp := range []struct {
		p    erasure.Proof
		note []byte
	}{{a1, heldA}, {b1, heldB}} {
		if err := e.WriteCheckpoint(ctx, cp.p.Log, 1, string(cp.note)); err != nil {
			t.Fatal(err)
		}
	}
	b2 := f.proof("uid-b2", "store-b", 1)
	mirror(b2, 1)
	latestA := f.sign(logOf(a2), a2, heldA, heldB)
	latestB := f.sign(logOf(b2), b2, heldA, heldB)
	if err := e.WriteCheckpoint(ctx, a2.Log, 2, string(latestA)); err != nil {
		t.Fatal(err)
	}
	if err := e.WriteCheckpoint(ctx, b2.Log, 2, string(latestB)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		store string
		held  []byte
		want  []string
	}{{"store-a", heldA, []string{"uid-a1", "uid-a2"}}, {"store-b", heldB, []string{"uid-b1", "uid-b2"}}} {
		a, uids := f.audit(e, receiptlog.Origin(tc.store), tc.held)
		if a.Size != 2 || a.Checkpoints != 2 || !slices.Equal(uids, tc.want) {
			t.Errorf("audit of %s: %d leaves, %d checkpoints, proofs %v; want 2, 2, %v", tc.store, a.Size, a.Checkpoints, uids, tc.want)
		}
	}

	// Store a created again as store c: its request erases again.
	a1c := f.proof("uid-a1", "store-c", 2)
	if idx, err := e.MirrorProof(ctx, a1c); err != nil || idx != 0 {
		t.Fatalf("the request of a store created again: leaf %d, %v; want leaf 0 of the new store's log", idx, err)
	}
	// Another request of the old store, its history unchanged, mirrored
	// again under the new store (its inclusion was never written): a leaf
	// of it goes into the new store's log, where the new store reads it.
	a2c := a2
	a2c.Log = a1c.Log
	if idx, err := e.MirrorProof(ctx, a2c); err != nil || idx != 1 {
		t.Fatalf("a request of the old store mirrored again under the new one: leaf %d, %v; want leaf 1 of the new store's log", idx, err)
	}
	if a, uids := f.audit(e, a1c.Log); a.Size != 2 || !slices.Equal(uids, []string{"uid-a1", "uid-a2"}) {
		t.Errorf("audit of the new store: %d leaves, proofs %v; want 2 and uid-a1, uid-a2", a.Size, uids)
	}
	if got, _, err := e.ReadProof(ctx, "uid-a2"); err != nil || got.Log != a1c.Log {
		t.Errorf("the proof mirrored again under the new store names log %q (%v), want the new store's", got.Log, err)
	}
	if held, err := e.ProofMirrored(ctx, a2, -1); err != nil || !held {
		t.Errorf("the proof in the old store's log: held %v (%v), want held there", held, err)
	}
	if held, err := e.ProofMirrored(ctx, f.proof("uid-a1", "store-b", 2), -1); err != nil || held {
		t.Errorf("a proof whose leaf is only in another store's log: held %v (%v), want not held in store b's", held, err)
	}
	if _, uids := f.audit(e, a1.Log, heldA); !slices.Equal(uids, []string{"uid-a1", "uid-a2"}) {
		t.Errorf("audit of the old store after its request went on in the new one: proofs %v, want uid-a1 (a leaf of it is here) and uid-a2", uids)
	}

	refused := map[string]struct {
		p    erasure.Proof
		want string
	}{
		"a proof without a log":       {func() erasure.Proof { p := f.proof("uid-c", "", 1); p.Log = ""; return p }(), "is not the origin"},
		"a log that is not a store's": {func() erasure.Proof { p := f.proof("uid-c", "", 1); p.Log = "example.com/log"; return p }(), "is not the origin"},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			_, err := e.MirrorProof(ctx, tc.p)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "LE003" || !strings.Contains(pgErr.Message, tc.want) {
				t.Fatalf("got %v, want SQLSTATE LE003 saying %q", err, tc.want)
			}
		})
	}
	// A leaf removed from the middle of a log (an edit with the owner's
	// rights): the log reads as one that does not extend what was signed.
	owner, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = owner.Close(ctx) }()
	if _, err := owner.Exec(ctx, `DELETE FROM lethe.receipt_log WHERE origin = $1 AND idx = 0`, b1.Log); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ReceiptLog(ctx, b1.Log); !errors.Is(err, receiptlog.ErrInconsistent) {
		t.Fatalf("a log with a leaf removed from its middle read with %v, want receiptlog.ErrInconsistent", err)
	}
}

// A database whose one receipt log several stores shared (before 00023)
// keeps every checkpoint they signed: the shared leaves become the prefix
// of each store's log, so each store's log after the upgrade extends the
// checkpoints its requests hold; each kept checkpoint is the log's its
// origin names; the auditor of each store verifies. Undoing the migration
// is refused once a store's own log holds a leaf.
func TestSplittingASharedReceiptLogKeepsEveryCheckpointSignedBefore(t *testing.T) {
	ctx := context.Background()
	dsn, p := databaseAt(t, 22)
	f := newLogFixture(t)
	owner, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = owner.Close(ctx) }()
	// The manager before 00023: one log for the database.
	legacy := func(p erasure.Proof) {
		t.Helper()
		history, _ := json.Marshal(p.History)
		doc, _ := json.Marshal(p.Document)
		if _, err := owner.Exec(ctx, `SELECT lethe.record_proof($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb)`,
			p.UID, p.Format, p.Digest, p.Envelope, p.KeyID, p.IssuedAt, string(history), string(doc)); err != nil {
			t.Fatal(err)
		}
	}
	shared := func() [][32]byte {
		t.Helper()
		rows, _ := owner.Query(ctx, `SELECT leaf_hash FROM lethe.receipt_log ORDER BY idx`)
		hashes, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			t.Fatal(err)
		}
		out := make([][32]byte, len(hashes))
		for i, h := range hashes {
			out[i] = [32]byte(h)
		}
		return out
	}
	a1, b1, a2 := f.proof("uid-a1", "store-a", 1), f.proof("uid-b1", "store-b", 1), f.proof("uid-a2", "store-a", 1)
	legacy(a1)
	legacy(b1)
	heldB := f.sign(shared(), b1)
	legacy(a2)
	heldA := f.sign(shared(), a2, heldB)
	for size, note := range map[int][]byte{2: heldB, 3: heldA} {
		if _, err := owner.Exec(ctx, `INSERT INTO lethe.receipt_log_checkpoints (size, checkpoint) VALUES ($1, $2)`, size, string(note)); err != nil {
			t.Fatal(err)
		}
	}

	migrateTo(t, p, 23)
	mdsn, err := testenv.ManagerDSN(ctx, dsn, true)
	if err != nil {
		t.Fatal(err)
	}
	e := eraser(t, mdsn, "t1")
	a3, b2 := f.proof("uid-a3", "store-a", 1), f.proof("uid-b2", "store-b", 1)
	for _, p := range []erasure.Proof{a3, b2} {
		if idx, err := e.MirrorProof(ctx, p); err != nil || idx != 3 {
			t.Fatalf("mirror %s: leaf %d, %v; want leaf 3, after the shared three", p.UID, idx, err)
		}
	}
	// A request of store b from before erases again: its new leaf goes
	// into b's log; its first stays in the prefix store a's log shares.
	if idx, err := e.MirrorProof(ctx, f.proof("uid-b1", "store-b", 2)); err != nil || idx != 4 {
		t.Fatalf("uid-b1 erasing again: leaf %d, %v; want leaf 4 of store b's log", idx, err)
	}
	for _, tc := range []struct {
		p    erasure.Proof
		held []byte
		want []string
		size int64
	}{{a3, heldA, []string{"uid-a1", "uid-a2", "uid-a3", "uid-b1"}, 4}, {b2, heldB, []string{"uid-a1", "uid-a2", "uid-b1", "uid-b2"}, 5}} {
		leaves, err := e.ReceiptLog(ctx, tc.p.Log)
		if err != nil {
			t.Fatal(err)
		}
		last := tc.p
		if tc.p.Log == b2.Log {
			last = f.proof("uid-b1", "store-b", 2)
		}
		note := f.sign(leaves, last, heldA, heldB) // refuses a log that does not extend them
		if err := e.WriteCheckpoint(ctx, tc.p.Log, int64(len(leaves)), string(note)); err != nil {
			t.Fatal(err)
		}
		a, uids := f.audit(e, tc.p.Log, tc.held)
		if a.Size != tc.size || a.Checkpoints != 2 || !slices.Equal(uids, tc.want) {
			t.Errorf("audit of %s: %d leaves, %d checkpoints, proofs %v; want %d, 2 (the one kept and the new), %v",
				tc.p.Log, a.Size, a.Checkpoints, uids, tc.size, tc.want)
		}
	}
	if _, err := p.DownTo(ctx, 22); err == nil || !strings.Contains(err.Error(), "cannot be undone") {
		t.Fatalf("undoing 00023 with store logs: %v, want it refused", err)
	}
}
