package v1alpha1_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

var canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// FuzzAdmission sends requests with fuzzed session IDs, reasons and grace
// periods to the real API server (server-side dry run, nothing stored): a
// request is admitted exactly when every ID is a canonical lowercase UUID,
// the IDs differ, an immediate request has a reason and the grace period is
// a non-negative duration. Refusals come from admission, never a crash.
// `go test` runs the seeds against the suite's API server; the fuzzing engine
// is not used here (each of its workers would start its own control plane):
// the same rules are fuzzed in-process by test/admission's FuzzAdmissionRules
// (the CRD's schema and CEL rules) and internal/erasurecli's FuzzCreateRequest.
func FuzzAdmission(f *testing.F) {
	f.Add("6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f", false, "", "168h")
	f.Add("'; DELETE FROM memory.sessions; --", "x", true, "r", "1h")
	f.Add("6F1C2A4E-8B3D-4F5A-9C7E-1D2B3A4C5E6F", "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", true, " ", "-1h")
	f.Add("6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", false, "", "0s")
	f.Fuzz(func(t *testing.T, a, b string, immediate bool, reason, grace string) {
		er := &lethev1.ErasureRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "fuzz", Namespace: "default"},
			Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"},
				SessionIDs: []lethev1.SessionID{lethev1.SessionID(a), lethev1.SessionID(b)}, Immediate: immediate, Reason: reason},
		}
		if !immediate {
			// Go clients can only send what metav1.Duration parses; raw strings are the admission tests' job.
			if d, err := time.ParseDuration(grace); err == nil {
				er.Spec.GracePeriod = &metav1.Duration{Duration: d}
			}
		}
		err := k8s.Create(context.Background(), er, client.DryRunAll)
		want := canonicalUUID.MatchString(a) && canonicalUUID.MatchString(b) && a != b &&
			(!immediate || strings.TrimSpace(reason) != "") && len(reason) <= 1024 &&
			(er.Spec.GracePeriod == nil || er.Spec.GracePeriod.Duration > 0)
		if want && err != nil {
			t.Fatalf("a valid request was refused: %v", err)
		}
		if !want && err == nil {
			t.Fatalf("an invalid request was admitted: %+v", er.Spec)
		}
	})
}
