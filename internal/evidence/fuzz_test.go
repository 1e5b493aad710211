package evidence_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// fuzzKey is one key for every fuzz input (generating one per input is slow).
var fuzzKey = func() *evidence.Key {
	k, err := evidence.GenerateKey()
	if err != nil {
		panic(err)
	}
	return k
}()

// mutate changes one field of a completed request, chosen by field.
func mutate(er *lethev1.ErasureRequest, entry, field int, value string) {
	h := er.Status.History
	e := &h[((entry%len(h))+len(h))%len(h)]
	st := &er.Status.Evidence.Steps[0]
	switch ((field % 12) + 12) % 12 {
	case 0:
		e.Phase = lethev1.Phase(value)
	case 1:
		e.Event = value
	case 2:
		e.EvidenceDigest = value
	case 3:
		e.PreviousDigest = value
	case 4:
		e.Digest = value
	case 5:
		e.Time.Time = e.Time.Add(time.Duration(len(value)) * time.Second)
	case 6:
		e.Signature = value
	case 7:
		e.EvidenceParts[evidence.PlanPart] = value
	case 8:
		st.Counts[0].Rows += int64(len(value))
	case 9:
		st.Note = value
	case 10:
		er.Status.Plan.Embeddings += int64(len(value))
	case 11:
		er.Status.Receipt.Digest = value
	}
}

// FuzzVerifyRequest: any change to any of these fields of a signed,
// completed request is detected, and no input makes the verifier panic.
func FuzzVerifyRequest(f *testing.F) {
	f.Add(0, 0, "x")
	f.Add(2, 3, "")
	f.Add(1, 8, "sha256:00")
	f.Add(3, 9, "probed 8")
	key := fuzzKey
	f.Fuzz(func(t *testing.T, entry, field int, value string) {
		er := completed(t, key, "a")
		before := er.DeepCopy()
		mutate(er, entry, field, value)
		_, err := evidence.VerifyRequest(context.Background(), er, evidence.Options{KeySet: keySet(t, key)})
		if equality.Semantic.DeepEqual(before, er) {
			if err != nil {
				t.Fatalf("an unchanged request does not verify: %v", err)
			}
			return
		}
		if err == nil {
			t.Fatalf("changed field %d of entry %d to %q and the request still verifies", field, entry, value)
		}
	})
}

// FuzzReadBundle: no bundle file makes reading and verifying it panic.
func FuzzReadBundle(f *testing.F) {
	raw, err := json.Marshal(evidence.NewBundle(completedForSeed(), evidence.KeySet{}, "fuzz", time.Now()))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add([]byte(`{"format":"lethe.dev/evidence-bundle/v1","request":{"status":{"history":[{}]}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		bundle, err := evidence.ReadBundle(b)
		if err != nil {
			return
		}
		_, _ = evidence.VerifyBundle(context.Background(), bundle, nil, true)
	})
}

func completedForSeed() *lethev1.ErasureRequest {
	t := &testing.T{}
	return completed(t, fuzzKey, "seed")
}
