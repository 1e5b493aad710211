package erasure

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// TestReplicaWaitsKeepTheFirstPosition: a step that changed nothing since
// it last read a WAL position waits for that one, not for the primary's
// position now (which a busy primary moves ahead of any lagging replica);
// a change replaces it; caught up, it is forgotten.
func TestReplicaWaitsKeepTheFirstPosition(t *testing.T) {
	ctx := context.Background()
	var asked []string
	replayed := "0/00"
	s := &Scope{Request: newRequest(), Ports: Ports{Replicas: ReplicasFn(func(_ context.Context, lsn string) (bool, error) {
		asked = append(asked, lsn)
		return lsn <= replayed, nil
	})}}
	w := &ReplicaWaits{}
	first := tombstoneOf(Plan{Found: []string{"s1", "s2"}, HiddenAt: dbNow})
	steps := []struct {
		lsn, of, replayed string
		want              bool
	}{
		{"0/A0", first, "0/50", false}, // the tombstone: wait for 0/A0
		{"0/B0", first, "0/A8", true},  // a repeat: still 0/A0, now replayed; forgotten
		{"0/C0", first, "0/A8", false}, // asked again after that: the position now
		{"0/D0", tombstoneOf(Plan{Found: []string{"s1", "s2", "s3"}, HiddenAt: dbNow.Add(time.Second)}), "0/C8", false}, // s3 hidden: its position
		{"0/E0", "", "0/C8", false}, // nothing changed ("" keeps it)
	}
	for i, st := range steps {
		replayed = st.replayed
		ok, err := w.caughtUp(ctx, s, "Tombstoned", st.lsn, st.of)
		if err != nil || ok != st.want {
			t.Fatalf("step %d: caught up %v (%v), want %v", i, ok, err, st.want)
		}
	}
	if diff := cmp.Diff([]string{"0/A0", "0/A0", "0/C0", "0/D0", "0/D0"}, asked); diff != "" {
		t.Errorf("positions asked (-want +got):\n%s", diff)
	}
	if tombstoneOf(Plan{Found: []string{"s2", "s1"}, HiddenAt: dbNow}) != first {
		t.Errorf("tombstoneOf: a repeat that found and hid nothing new must keep the position")
	}

	w.forget(string(s.Request.UID), "Tombstoned")
	if _, err := w.caughtUp(ctx, s, "Tombstoned", "0/F0", ""); err != nil || asked[len(asked)-1] != "0/F0" {
		t.Errorf("after forget: asked %s, want the position read now", asked[len(asked)-1])
	}
	var none *ReplicaWaits
	if _, err := none.caughtUp(ctx, s, "Tombstoned", "0/F8", ""); err != nil || asked[len(asked)-1] != "0/F8" {
		t.Errorf("nil ReplicaWaits: asked %s, want the position given", asked[len(asked)-1])
	}
}

// TestTombstoneWaitCoversASessionFoundWithAnOlderTombstone: a session
// found for the first time whose tombstone another writer dated earlier
// (tombstoned_at is its transaction's start) but committed after the
// remembered position leaves the latest tombstone as it was; the position
// is replaced all the same, or a replica short of that commit still serves
// the session.
func TestTombstoneWaitCoversASessionFoundWithAnOlderTombstone(t *testing.T) {
	ctx := context.Background()
	var asked []string
	replayed := "0/A8"
	s := &Scope{Request: newRequest(), Ports: Ports{Replicas: ReplicasFn(func(_ context.Context, lsn string) (bool, error) {
		asked = append(asked, lsn)
		return lsn <= replayed, nil
	})}}
	w := &ReplicaWaits{}
	if ok, err := w.caughtUp(ctx, s, "Tombstoned", "0/B0", tombstoneOf(Plan{Found: []string{"s1"}, HiddenAt: dbNow})); err != nil || ok {
		t.Fatalf("first pass: caught up %v (%v), want a wait for 0/B0", ok, err)
	}
	later := tombstoneOf(Plan{Found: []string{"s1", "s2"}, HiddenAt: dbNow}) // s2 hidden at dbNow-1s, committed after 0/B0
	replayed = "0/B8"
	if ok, err := w.caughtUp(ctx, s, "Tombstoned", "0/C0", later); err != nil || ok {
		t.Fatalf("s2 found: caught up %v (%v), want a wait for 0/C0, past s2's tombstone", ok, err)
	}
	if diff := cmp.Diff([]string{"0/B0", "0/C0"}, asked); diff != "" {
		t.Errorf("positions asked (-want +got):\n%s", diff)
	}
}

// TestDeletionWaitsForTheReplicasAtItsOwnPosition: the deletion's passes
// while a replica lags wait for the position read after the pass that
// erased; a later erasure by anyone (the ledger's latest erased_at moved)
// or a residue removal (its own position) replaces it.
func TestDeletionWaitsForTheReplicasAtItsOwnPosition(t *testing.T) {
	ctx := context.Background()
	d := &Deletion{Config: testConfig, Waits: &ReplicaWaits{}}
	var asked []string
	lsn, erasedAt := "0/3000060", deletedAt
	residue := false
	f := deletionFakes(func(f *fakes) {
		f.replicas = func(_ context.Context, l string) (bool, error) { asked = append(asked, l); return false, nil }
		f.ledger.DeleteFn = func(context.Context, Request, int, int) (DeleteResult, error) {
			r := deleteResult()
			r.CommitLSN, r.ErasedAt = lsn, erasedAt
			return r, nil
		}
		f.ledger.DeletedAtFn = func(context.Context, string) (time.Time, error) { return erasedAt, nil }
		f.ledger.VerifyFn = func(context.Context, Request, ContentKeys) ([]Verification, error) {
			if residue {
				residue = false
				return append(clean, Verification{Check: CheckPrefixDerived + "memory_derived.profiles", Found: 1}), nil
			}
			return clean, nil
		}
		f.ledger.RemoveResidueFn = func(context.Context, Request) (BatchResult, error) {
			return BatchResult{Batch: 1, DerivedRecords: 1, CommitLSN: "0/6000000"}, nil
		}
	})
	pass := func() {
		t.Helper()
		ports, _ := f.wire(t)
		out := d.Run(ctx, &Scope{Request: atDeletion(), Store: newStore(), Ports: ports})
		if out.Condition == nil || out.Condition.Reason != lethev1.ReasonReplicaLagging {
			t.Fatalf("outcome %+v, want waiting for the replicas", out.Condition)
		}
	}
	pass()            // erased at 0/3000060
	lsn = "0/4000000" // the primary moved on; nothing erased since
	pass()            // still 0/3000060
	erasedAt = deletedAt.Add(time.Second)
	lsn = "0/5000000" // another manager erased more
	pass()
	residue = true
	pass() // residue removed after the deletion's position
	if diff := cmp.Diff([]string{"0/3000060", "0/3000060", "0/5000000", "0/6000000"}, asked); diff != "" {
		t.Errorf("positions asked (-want +got):\n%s", diff)
	}
}

// TestDeletionWaitKeysOnTheErasureReadWithThePosition: an erasure by
// another writer that commits after the position the deletion read, and
// before it reads the deletion time for the evidence, is not covered by
// that position; the next pass must not take it as covered and keep it.
func TestDeletionWaitKeysOnTheErasureReadWithThePosition(t *testing.T) {
	ctx := context.Background()
	d := &Deletion{Config: testConfig, Waits: &ReplicaWaits{}}
	var asked []string
	lsn, withPosition, later := "0/3000060", deletedAt, deletedAt.Add(time.Second)
	f := deletionFakes(func(f *fakes) {
		f.replicas = func(_ context.Context, l string) (bool, error) { asked = append(asked, l); return false, nil }
		f.ledger.DeleteFn = func(context.Context, Request, int, int) (DeleteResult, error) {
			r := deleteResult()
			r.CommitLSN, r.ErasedAt = lsn, withPosition
			return r, nil
		}
		// Another manager's erasure committed after the position: the
		// deletion time the evidence reads already has it.
		f.ledger.DeletedAtFn = func(context.Context, string) (time.Time, error) { return later, nil }
	})
	for range 2 {
		ports, _ := f.wire(t)
		out := d.Run(ctx, &Scope{Request: atDeletion(), Store: newStore(), Ports: ports})
		if out.Condition == nil || out.Condition.Reason != lethev1.ReasonReplicaLagging {
			t.Fatalf("outcome %+v, want waiting for the replicas", out.Condition)
		}
		// The next pass reads a position past that erasure, with it.
		lsn, withPosition = "0/4000000", later
	}
	if diff := cmp.Diff([]string{"0/3000060", "0/4000000"}, asked); diff != "" {
		t.Errorf("positions asked (-want +got):\n%s", diff)
	}
}

// A pass that stops short of the replica wait (residue found, rows left, a
// failure) drops the remembered position: what it found may be removed
// later by someone else, past that position, and a replica short of the
// removal still serves it. The next clean pass waits for a position read
// after it, though the ledger's latest erasure has not moved.
func TestDeletionStoppedShortForgetsTheReplicaPosition(t *testing.T) {
	ctx := context.Background()
	d := &Deletion{Config: testConfig, Waits: &ReplicaWaits{}}
	var asked []string
	lsn := "0/3000060"
	residue := false
	f := deletionFakes(func(f *fakes) {
		f.replicas = func(_ context.Context, l string) (bool, error) { asked = append(asked, l); return false, nil }
		f.ledger.DeleteFn = func(context.Context, Request, int, int) (DeleteResult, error) {
			r := deleteResult()
			r.CommitLSN = lsn
			return r, nil
		}
		f.ledger.ProbeResidueFn = func(context.Context, []Embedding, float64) ([]Residue, error) {
			if residue {
				return []Residue{{Column: `"memory"."notes"."embedding"`, Found: 1}}, nil
			}
			return nil, nil
		}
	})
	pass := func(want string) {
		t.Helper()
		ports, _ := f.wire(t)
		out := d.Run(ctx, &Scope{Request: atDeletion(), Store: newStore(), Ports: ports})
		if out.Condition == nil || out.Condition.Reason != want {
			t.Fatalf("outcome %+v, want %s", out.Condition, want)
		}
	}
	pass(lethev1.ReasonReplicaLagging) // waits for 0/3000060
	residue, lsn = true, "0/4000000"   // a copy written past it
	pass(lethev1.ReasonResidueFound)
	residue, lsn = false, "0/5000000" // removed by someone, past that
	pass(lethev1.ReasonReplicaLagging)
	if diff := cmp.Diff([]string{"0/3000060", "0/5000000"}, asked); diff != "" {
		t.Errorf("positions asked (-want +got):\n%s", diff)
	}
}
