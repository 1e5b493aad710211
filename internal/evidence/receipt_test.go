package evidence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

func newKey(t *testing.T) (*evidence.Key, *evidence.Key) {
	t.Helper()
	pemKey, err := evidence.GeneratePrivateKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	k, err := evidence.ParsePrivateKey(pemKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM, err := k.PublicKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := evidence.ParsePublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	if pub.ID() != k.ID() {
		t.Fatalf("key IDs differ: %s / %s", pub.ID(), k.ID())
	}
	return k, pub
}

func completed(t *testing.T) *lethev1.ErasureRequest {
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "forget", UID: "1234"}}
	er.Spec.StoreRef.Name = "memory"
	er.Status.History = chain(t)
	er.Status.Phase = lethev1.PhaseBackupsRotated
	er.Status.Evidence = &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{{Step: "Deleted", Counts: []lethev1.TableCount{{Table: "memory.sessions", Rows: 2}}}}}
	return er
}

func TestSignedReceiptVerifiesAndTamperingIsCaught(t *testing.T) {
	ctx := context.Background()
	key, pub := newKey(t)
	er := completed(t)
	r, err := evidence.Issue(ctx, er, key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	er.Status.Receipt = r
	if r.KeyID != key.ID() || r.Envelope == "" || r.Digest != evidence.Head(er.Status.History) {
		t.Fatalf("receipt %+v", r)
	}
	if err := evidence.VerifyReceipt(ctx, er, pub); err != nil {
		t.Fatalf("a genuine receipt does not verify: %v", err)
	}
	// A later entry (a Resurrected re-verification) keeps the receipt valid.
	er.Status.History = evidence.Append(er.Status.History, lethev1.PhaseBackupsRotated, "Resurrected", time.Now(), "sha256:00")
	if err := evidence.VerifyReceipt(ctx, er, pub); err != nil {
		t.Fatalf("a later history entry broke the receipt: %v", err)
	}

	other, otherPub := newKey(t)
	_ = other
	for name, tc := range map[string]struct {
		tamper func(er *lethev1.ErasureRequest)
		key    *evidence.Key
		want   string
	}{
		"edited entry": {func(er *lethev1.ErasureRequest) { er.Status.History[1].Phase = lethev1.PhaseCancelled }, pub, "entry 1"},
		"dropped entry": {func(er *lethev1.ErasureRequest) {
			er.Status.History = append(er.Status.History[:1:1], er.Status.History[2:]...)
		}, pub, "entry 1"},
		"receipt digest swapped": {func(er *lethev1.ErasureRequest) { er.Status.Receipt.Digest = er.Status.History[0].Digest }, pub, "does not name"},
		"another key":            {func(*lethev1.ErasureRequest) {}, otherPub, "does not verify"},
		"envelope edited": {func(er *lethev1.ErasureRequest) {
			er.Status.Receipt.Envelope = strings.Replace(er.Status.Receipt.Envelope, `"payload":"`, `"payload":"x`, 1)
		}, pub, ""},
		"unsigned": {func(er *lethev1.ErasureRequest) { er.Status.Receipt.Envelope = "" }, pub, "unsigned"},
	} {
		c := er.DeepCopy()
		tc.tamper(c)
		err := evidence.VerifyReceipt(ctx, c, tc.key)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, tc.want)
		}
	}
}

func TestUnsignedReceiptCarriesTheDigestOnly(t *testing.T) {
	er := completed(t)
	r, err := evidence.Issue(context.Background(), er, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r.Envelope != "" || r.KeyID != "" || r.Digest != evidence.Head(er.Status.History) {
		t.Fatalf("unsigned receipt %+v", r)
	}
	er.Status.Receipt = r
	if err := evidence.VerifyReceipt(context.Background(), er, nil); err != nil {
		t.Fatalf("chain-only verification: %v", err)
	}
}
