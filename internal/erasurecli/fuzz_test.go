package erasurecli

import (
	"strings"
	"testing"
	"time"
)

// FuzzCreateRequest: whatever the flags, building the request never panics,
// and an accepted request holds only valid, distinct session IDs and a
// reason when immediate.
func FuzzCreateRequest(f *testing.F) {
	f.Add("6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "memory", true, "")
	f.Add("'; DROP TABLE memory.sessions; --", "", "m", false, "r")
	f.Add("6F1C2A4E-8B3D-4F5A-9C7E-1D2B3A4C5E6F", "x", "", true, " ")
	f.Fuzz(func(t *testing.T, a, b, store string, immediate bool, reason string) {
		c := &specFlags{store: store, ids: []string{a, b}, immediate: immediate, reason: reason}
		er, err := c.request("r", "ns", strings.NewReader(""), time.Now())
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, id := range er.Spec.SessionIDs {
			if !sessionID.MatchString(string(id)) || seen[string(id)] {
				t.Fatalf("accepted session ID %q (seen before: %v)", id, seen[string(id)])
			}
			seen[string(id)] = true
		}
		if er.Spec.Immediate && strings.TrimSpace(er.Spec.Reason) == "" {
			t.Fatal("an immediate request without a reason was accepted")
		}
		if er.Spec.StoreRef.Name == "" {
			t.Fatal("a request without a store was accepted")
		}
	})
}
