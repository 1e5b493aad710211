package erasurecli

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// The certificate shows when the receipt was issued as the receipt signed
// it, not as the unsigned status.receipt.issuedAt says (removed here, so
// that the verifier has nothing to compare it with).
func TestCertificateShowsTheSignedIssueTime(t *testing.T) {
	ctx := context.Background()
	key, err := evidence.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ks, _, err := evidence.KeySet{}.WithCurrent(key, t0.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "forget", UID: "req-1", CreationTimestamp: metav1.NewTime(t0)}}
	er.Spec.StoreRef.Name = "memory"
	er.Spec.SessionIDs = []lethev1.SessionID{"0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f"}
	er.Status.EvidenceFormat = evidence.Format
	er.Status.Deadline = &metav1.Time{Time: t0.AddDate(0, 1, 0)}
	for i, phase := range []lethev1.Phase{lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod, lethev1.PhaseDeleted, lethev1.PhaseBackupsRotated} {
		parts := evidence.PartsOf(er)
		d, err := evidence.CanonicalDigest(evidence.DocumentFor(er, parts, ""))
		if err != nil {
			t.Fatal(err)
		}
		c := evidence.ChainOf(er)
		c.AppendEntry(lethev1.HistoryEntry{Phase: phase, Time: metav1.NewTime(t0.Add(time.Duration(i) * time.Hour)), EvidenceDigest: d, EvidenceParts: parts}, key)
		er.Status.History = c.History
	}
	er.Status.Phase = lethev1.PhaseBackupsRotated
	signed := t0.Add(5 * time.Hour)
	if er.Status.Receipt, err = evidence.Issue(ctx, er, key, signed); err != nil {
		t.Fatal(err)
	}
	er.Status.Receipt.IssuedAt = nil
	rep, verr := evidence.VerifyRequest(ctx, er, evidence.Options{KeySet: ks})
	if verr != nil {
		t.Fatalf("the request does not verify: %v", verr)
	}
	c := certificate(er, ks, rep, verr)
	if c.Receipt == nil || !c.Receipt.IssuedAt.Equal(signed) {
		t.Fatalf("certificate receipt %+v, want issued at the signed %s", c.Receipt, signed)
	}
}
