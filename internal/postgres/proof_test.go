package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// The mirrored proof only grows: a repeat or a shorter history changes
// nothing; a longer one (a re-erasure's entry) replaces it. The manager's
// role writes it.
func TestMirroredProofOnlyGrows(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	mdsn, err := testenv.ManagerDSN(ctx, dsn, true)
	if err != nil {
		t.Fatal(err)
	}
	e := eraser(t, mdsn, "t1")
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	h := evidence.Append(nil, lethev1.PhaseTombstoned, "", at, "sha256:a")
	h = evidence.Append(h, lethev1.PhaseBackupsRotated, "", at.Add(time.Hour), "sha256:b")
	p := erasure.Proof{UID: "uid-p", Digest: evidence.Head(h), Envelope: "{}", KeyID: "k", IssuedAt: at.Add(time.Hour), History: h}
	for range 2 {
		if err := e.MirrorProof(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	longer := p
	longer.History = evidence.Append(h, lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, at.Add(2*time.Hour), "sha256:c")
	if err := e.MirrorProof(ctx, longer); err != nil {
		t.Fatal(err)
	}
	if err := e.MirrorProof(ctx, p); err != nil { // a stale pass with the shorter history
		t.Fatal(err)
	}
	got, found, err := e.ReadProof(ctx, "uid-p")
	if err != nil || !found {
		t.Fatalf("read the proof: found %v, %v", found, err)
	}
	if diff := cmp.Diff(longer.History, got.History); diff != "" || got.Digest != p.Digest || got.KeyID != "k" {
		t.Fatalf("proof read back (-want +got):\n%s\ndigest %s key %s", diff, got.Digest, got.KeyID)
	}
	if _, found, err := e.ReadProof(ctx, "uid-none"); err != nil || found {
		t.Fatalf("a request without a proof: found %v, %v", found, err)
	}
}
