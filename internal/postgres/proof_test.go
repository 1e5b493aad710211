package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/mod/sumdb/tlog"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/receiptlog"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// proofOf is a signed v1 chain of n entries of request uid, as a proof.
func proofOf(t *testing.T, uid string, n int, key *evidence.Key) erasure.Proof {
	t.Helper()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	c := evidence.Chain{Format: evidence.Format, Request: uid}
	for i := range n {
		// An event with what JSON must escape: the database recomputes the
		// digest, its escaping must be RFC 8785's.
		c.Append(lethev1.PhaseBackupsRotated, "Ev\"\\\n\u00e9<&>"+string(rune('a'+i)), at.Add(time.Duration(i)*time.Hour), "sha256:aa", key)
	}
	return erasure.Proof{UID: uid, Digest: evidence.Head(c.History), Envelope: "{}", KeyID: key.ID(), IssuedAt: at, History: c.History,
		Format: evidence.Format, Document: map[string]any{"format": evidence.Format}, Log: storeLog}
}

// storeLog is the receipt log the tests' proofs go into.
var storeLog = receiptlog.Origin("store-1")

// managerEraser is an Eraser of tenant t1 on a new migrated database, as
// the manager's role; it returns the database's owner DSN and the role's.
func managerEraser(t *testing.T) (dsn, mdsn string, e *postgres.Eraser) {
	t.Helper()
	dsn = migratedDB(t)
	mdsn, err := testenv.ManagerDSN(context.Background(), dsn, true)
	if err != nil {
		t.Fatal(err)
	}
	return dsn, mdsn, eraser(t, mdsn, "t1")
}

func signingKey(t *testing.T) *evidence.Key {
	t.Helper()
	k, err := evidence.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The proof goes in only through lethe.record_proof: it only grows, each
// length gets one leaf of the receipt log (the database computes the leaf
// as the Go code does), and a history that does not recompute, does not
// extend the recorded one, or a receipt over no entry is refused.
func TestRecordProofChecksTheChainAndLogsIt(t *testing.T) {
	ctx := context.Background()
	_, mdsn, e := managerEraser(t)
	key := signingKey(t)
	long := proofOf(t, "uid-p", 3, key)
	p := long
	p.History, p.Digest = long.History[:2], long.History[1].Digest
	mirror := func(p erasure.Proof) int64 {
		t.Helper()
		idx, err := e.MirrorProof(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
	if a, b := mirror(p), mirror(p); a != 0 || b != 0 {
		t.Fatalf("a repeat added a leaf: %d, %d", a, b)
	}
	if idx := mirror(long); idx != 1 {
		t.Fatalf("the longer history's leaf: %d, want 1", idx)
	}
	if idx := mirror(p); idx != 0 { // a stale pass with the shorter history
		t.Fatalf("a stale writer's leaf: %d, want the existing 0", idx)
	}
	got, found, err := e.ReadProof(ctx, "uid-p")
	if err != nil || !found {
		t.Fatalf("read the proof: found %v, %v", found, err)
	}
	if diff := cmp.Diff(long.History, got.History); diff != "" || got.Format != evidence.Format {
		t.Fatalf("proof read back (-want +got):\n%s", diff)
	}
	leaves, err := e.ReceiptLog(ctx, storeLog)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{2, 3} {
		want := receiptlog.LeafHash(evidence.LogLeaf("uid-p", long.History[n-1].Digest, n))
		if len(leaves) != 2 || tlog.Hash(leaves[i]) != want {
			t.Fatalf("leaf %d computed by the database differs from the Go leaf (%d leaves)", i, len(leaves))
		}
	}

	refused := map[string]struct {
		tamper func(p *erasure.Proof)
		want   string
	}{
		"an edited entry": {func(p *erasure.Proof) { p.History[1].Event = "Edited" }, "history entry 1 does not recompute"},
		"a reordered history": {func(p *erasure.Proof) {
			p.History[0], p.History[1] = p.History[1], p.History[0]
		}, "history entry 0 does not link"},
		"a history of another request": {func(p *erasure.Proof) { p.UID = "uid-q" }, "history entry 0 does not recompute"},
		"a receipt over no entry":      {func(p *erasure.Proof) { p.Digest = "sha256:00" }, "the receipt covers no entry"},
		"a history that does not extend the recorded one": {func(p *erasure.Proof) {
			*p = proofOf(t, "uid-p", 4, signingKey(t))
		}, "does not extend the one recorded"},
		"other evidence for the recorded history": {func(p *erasure.Proof) {
			p.Document = map[string]any{"format": evidence.Format, "edited": true}
		}, "the evidence differs from the one recorded"},
		"a stale history that is not a prefix": {func(p *erasure.Proof) {
			p.History = proofOf(t, "uid-p", 2, signingKey(t)).History
			p.Digest = p.History[1].Digest
		}, "does not match the one recorded"},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			q := proofOf(t, "uid-p", 3, key)
			q.History = append([]lethev1.HistoryEntry(nil), long.History...)
			tc.tamper(&q)
			_, err := e.MirrorProof(ctx, q)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "LE003" || !strings.Contains(pgErr.Message, tc.want) {
				t.Fatalf("got %v, want SQLSTATE LE003 saying %q", err, tc.want)
			}
		})
	}
	// The manager's role writes nowhere else: not the proofs, not the log.
	conn, err := pgx.Connect(ctx, mdsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	hist, _ := json.Marshal(long.History)
	for _, stmt := range []string{
		`INSERT INTO lethe.erasure_proofs (request_uid, digest, issued_at, history, history_count) VALUES ('uid-x', 'sha256:00', now(), '[]', 0)`,
		`UPDATE lethe.erasure_proofs SET history = '` + string(hist) + `'`,
		`DELETE FROM lethe.receipt_log WHERE idx = 0`,
		`UPDATE lethe.receipt_log SET leaf_hash = leaf_hash`,
		`INSERT INTO lethe.receipt_log (idx, request_uid, history_length, leaf_data, leaf_hash) VALUES (9, 'u', 1, '', sha256(''))`,
		`DELETE FROM lethe.receipt_log_checkpoints`,
	} {
		if _, err := conn.Exec(ctx, stmt); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("%s: got %v, want permission denied", stmt[:30], err)
		}
	}
}

// ProofMirrored is true exactly when MirrorProof would change nothing: the
// database holds this history, this evidence and the history's leaf (at
// the index asked). A proof a restore took back, a longer history, other
// evidence or another leaf index is not held, and is written again.
func TestProofMirroredHoldsOnlyWhatARepeatWouldLeaveUnchanged(t *testing.T) {
	ctx := context.Background()
	dsn, _, e := managerEraser(t)
	key := signingKey(t)
	long := proofOf(t, "uid-m", 3, key)
	short := long
	short.History, short.Digest = long.History[:2], long.History[1].Digest
	held := func(e *postgres.Eraser, p erasure.Proof, index int64) bool {
		t.Helper()
		ok, err := e.ProofMirrored(ctx, p, index)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if held(e, short, -1) {
		t.Fatal("a proof never mirrored is held")
	}
	// Another request's proof, mirrored first, takes leaf 0.
	if _, err := e.MirrorProof(ctx, proofOf(t, "uid-other", 1, key)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(strings.TrimPrefix(mustParse(t, dsn).Path, "/"), file); err != nil {
		t.Fatal(err)
	}
	idx, err := e.MirrorProof(ctx, short)
	if err != nil || idx != 1 {
		t.Fatalf("mirror: leaf %d, %v; want leaf 1", idx, err)
	}
	if !held(e, short, -1) || !held(e, short, idx) {
		t.Fatal("the proof just mirrored is not held")
	}
	if held(e, short, 0) {
		t.Fatal("held at leaf 0, another request's leaf")
	}
	if held(e, long, -1) {
		t.Fatal("a longer history is held before it was mirrored")
	}
	other := short
	other.Document = map[string]any{"format": evidence.Format, "edited": true}
	if held(e, other, idx) {
		t.Fatal("other evidence for the same history is held")
	}
	if _, err := e.MirrorProof(ctx, long); err != nil {
		t.Fatal(err)
	}
	if held(e, short, idx) || !held(e, long, 2) {
		t.Fatal("after the longer history: the shorter one is held, or the longer one is not at leaf 2")
	}
	// Edits in the database, with its owner's rights, are not held: an
	// earlier entry (its head digest unchanged) and the leaf's hash.
	owner, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = owner.Close(ctx) }()
	for _, edit := range []struct{ name, do, undo string }{
		{"an earlier entry",
			`UPDATE lethe.erasure_proofs SET history = jsonb_set(history, '{0,event}', '"Edited"') WHERE request_uid = 'uid-m'`,
			`UPDATE lethe.erasure_proofs SET history = jsonb_set(history, '{0,event}', to_jsonb($1::text)) WHERE request_uid = 'uid-m'`},
		{"the leaf's hash",
			`UPDATE lethe.receipt_log SET leaf_hash = sha256(leaf_hash) WHERE request_uid = 'uid-m' AND history_length = 3`,
			`UPDATE lethe.receipt_log SET leaf_hash = $1 WHERE request_uid = 'uid-m' AND history_length = 3`},
	} {
		var leaf []byte
		if err := owner.QueryRow(ctx, `SELECT leaf_hash FROM lethe.receipt_log WHERE request_uid = 'uid-m' AND history_length = 3`).Scan(&leaf); err != nil {
			t.Fatal(err)
		}
		if _, err := owner.Exec(ctx, edit.do); err != nil {
			t.Fatal(err)
		}
		if held(e, long, 2) {
			t.Fatalf("held with %s edited in the database", edit.name)
		}
		var back any = long.History[0].Event
		if strings.Contains(edit.undo, "leaf_hash") {
			back = leaf
		}
		if _, err := owner.Exec(ctx, edit.undo, back); err != nil {
			t.Fatal(err)
		}
		if !held(e, long, 2) {
			t.Fatalf("not held once %s is put back", edit.name)
		}
	}

	// A restore from the dump taken before the mirror takes the proof back.
	restored, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Restore(ctx, restored, file); err != nil {
		t.Fatal(err)
	}
	rdsn, err := testenv.ManagerDSN(ctx, pg.DSN(restored), false)
	if err != nil {
		t.Fatal(err)
	}
	r := eraser(t, rdsn, "t1")
	if held(r, short, -1) || held(r, long, -1) {
		t.Fatal("the restored database holds a proof mirrored after its dump")
	}
	if idx, err := r.MirrorProof(ctx, long); err != nil || idx != 1 || !held(r, long, 1) {
		t.Fatalf("mirrored again after the restore: leaf %d, %v; want leaf 1, held", idx, err)
	}
}
