package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/testenv"
)

var k8s client.Client

func TestMain(m *testing.M) {
	crds, err := testenv.LetheCRDDir()
	if err == nil {
		var cp *testenv.ControlPlane
		cp, err = testenv.StartControlPlane(crds)
		if err == nil {
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			_ = lethev1.AddToScheme(scheme)
			// Strict field validation: unknown fields are refused, not pruned.
			k8s, err = client.New(cp.Config, client.Options{Scheme: scheme})
			if err == nil {
				k8s = client.WithFieldValidation(k8s, metav1.FieldValidationStrict)
				code := m.Run()
				_ = cp.Stop()
				os.Exit(code)
			}
			_ = cp.Stop()
		}
	}
	fmt.Fprintln(os.Stderr, "FAIL: cannot start the control plane for the admission tests:", err)
	os.Exit(1)
}

const (
	id1 = "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f"
	id2 = "0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f"
)

var nameSeq int

func newName(prefix string) string {
	nameSeq++
	return fmt.Sprintf("%s-%d", prefix, nameSeq)
}

func validRequest() *lethev1.ErasureRequest {
	return &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: newName("req"), Namespace: "default"},
		Spec: lethev1.ErasureRequestSpec{
			StoreRef:   lethev1.StoreReference{Name: "memory"},
			SessionIDs: []lethev1.SessionID{id1, id2},
		},
	}
}

func validStore() *lethev1.MemoryStore {
	return &lethev1.MemoryStore{
		ObjectMeta: metav1.ObjectMeta{Name: newName("store"), Namespace: "default"},
		Spec: lethev1.MemoryStoreSpec{
			Postgres: lethev1.PostgresSpec{DSNSecretRef: lethev1.SecretKeyRef{Name: "pg", Key: "dsn"}},
		},
	}
}

// refused asserts err is an admission refusal whose message contains every want.
func refused(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("admitted, want refusal mentioning %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("refusal does not say %q:\n%v", w, err)
		}
	}
}

func ids(n int) []lethev1.SessionID {
	out := make([]lethev1.SessionID, n)
	for i := range out {
		out[i] = lethev1.SessionID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
	}
	return out
}

func TestRequestCreationIsValidated(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		mutate func(*lethev1.ErasureRequest)
		want   []string
	}{
		"not a UUID": {func(r *lethev1.ErasureRequest) { r.Spec.SessionIDs = []lethev1.SessionID{"not-a-uuid"} },
			[]string{"spec.sessionIDs[0]", "UUID in lowercase canonical form"}},
		"SQL in a session ID": {func(r *lethev1.ErasureRequest) {
			r.Spec.SessionIDs = []lethev1.SessionID{id1, "'); DELETE FROM memory.sessions; --"}
		}, []string{"spec.sessionIDs[1]"}},
		"uppercase UUID": {func(r *lethev1.ErasureRequest) {
			r.Spec.SessionIDs = []lethev1.SessionID{lethev1.SessionID(strings.ToUpper(id1))}
		}, []string{"lowercase canonical form"}},
		"duplicate IDs": {func(r *lethev1.ErasureRequest) { r.Spec.SessionIDs = []lethev1.SessionID{id1, id2, id1} },
			[]string{"spec.sessionIDs[2]", "Duplicate value"}},
		"no IDs": {func(r *lethev1.ErasureRequest) { r.Spec.SessionIDs = []lethev1.SessionID{} },
			[]string{"spec.sessionIDs", "at least 1 item"}},
		"1001 IDs": {func(r *lethev1.ErasureRequest) { r.Spec.SessionIDs = ids(1001) },
			[]string{"spec.sessionIDs", "at most 1000 items"}},
		"cross-namespace storeRef": {func(r *lethev1.ErasureRequest) { r.Spec.StoreRef.Namespace = "other-tenant" },
			[]string{"a request can only use a MemoryStore in its own namespace"}},
		"store name with SQL": {func(r *lethev1.ErasureRequest) { r.Spec.StoreRef.Name = "memory'; DROP TABLE x" },
			[]string{"spec.storeRef.name"}},
		"immediate without reason": {func(r *lethev1.ErasureRequest) { r.Spec.Immediate = true },
			[]string{"spec.reason is required when spec.immediate is true"}},
		"immediate with blank reason": {func(r *lethev1.ErasureRequest) { r.Spec.Immediate = true; r.Spec.Reason = "   " },
			[]string{"spec.reason is required when spec.immediate is true"}},
		"negative grace period": {func(r *lethev1.ErasureRequest) { r.Spec.GracePeriod = &metav1.Duration{Duration: -time.Hour} },
			[]string{"gracePeriod must be a non-negative Go duration"}},
		"zero grace period without immediate": {func(r *lethev1.ErasureRequest) { r.Spec.GracePeriod = &metav1.Duration{} },
			[]string{"gracePeriod 0s skips the grace period, the undo for typos: set spec.immediate: true with spec.reason instead"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := validRequest()
			tc.mutate(r)
			refused(t, k8s.Create(ctx, r), tc.want...)
		})
	}
	t.Run("1000 IDs are admitted", func(t *testing.T) {
		r := validRequest()
		r.Spec.SessionIDs = ids(1000)
		if err := k8s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	})
}

// Durations the Go types cannot express (a typo'd YAML) are refused too.
func TestRequestDurationStringsAreValidated(t *testing.T) {
	for _, grace := range []string{"7 days", "1d", "-5m", "168", "h", "1h; DROP TABLE x"} {
		t.Run(grace, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "erasure.lethe.dev/v1alpha1", "kind": "ErasureRequest",
				"metadata": map[string]any{"name": newName("dur"), "namespace": "default"},
				"spec": map[string]any{
					"storeRef": map[string]any{"name": "memory"}, "sessionIDs": []any{id1}, "gracePeriod": grace,
				},
			}}
			refused(t, k8s.Create(context.Background(), u), "gracePeriod must be a non-negative Go duration")
		})
	}
}

func TestRequestSpecIsImmutableExceptCancel(t *testing.T) {
	ctx := context.Background()
	edits := map[string]func(*lethev1.ErasureRequest){
		"sessionIDs":   func(r *lethev1.ErasureRequest) { r.Spec.SessionIDs = []lethev1.SessionID{id1} },
		"storeRef":     func(r *lethev1.ErasureRequest) { r.Spec.StoreRef.Name = "other" },
		"gracePeriod":  func(r *lethev1.ErasureRequest) { r.Spec.GracePeriod = &metav1.Duration{Duration: time.Minute} },
		"immediate":    func(r *lethev1.ErasureRequest) { r.Spec.Immediate = true; r.Spec.Reason = "deadline" },
		"reason added": func(r *lethev1.ErasureRequest) { r.Spec.Reason = "now with a reason" },
		"dryRun":       func(r *lethev1.ErasureRequest) { r.Spec.DryRun = true },
		"requestedAt":  func(r *lethev1.ErasureRequest) { r.Spec.RequestedAt = &metav1.Time{Time: time.Unix(1_700_000_000, 0)} },
	}
	for name, edit := range edits {
		t.Run(name, func(t *testing.T) {
			r := validRequest()
			if err := k8s.Create(ctx, r); err != nil {
				t.Fatal(err)
			}
			edit(r)
			refused(t, k8s.Update(ctx, r), "spec is immutable after creation")
		})
	}

	t.Run("cancel goes false to true, never back", func(t *testing.T) {
		r := validRequest()
		if err := k8s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		r.Spec.Cancel = true
		if err := k8s.Update(ctx, r); err != nil {
			t.Fatalf("cancel false -> true refused: %v", err)
		}
		r.Spec.Cancel = false
		refused(t, k8s.Update(ctx, r), "spec.cancel can only change from false to true")
	})
}

func TestRequestDefaults(t *testing.T) {
	r := validRequest()
	if err := k8s.Create(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if r.Spec.GracePeriod == nil || r.Spec.GracePeriod.Duration != 168*time.Hour || r.Spec.Immediate || r.Spec.DryRun || r.Spec.Cancel {
		t.Fatalf("defaults not applied: %+v", r.Spec)
	}
}

func historyEntry(i int) lethev1.HistoryEntry {
	return lethev1.HistoryEntry{
		Phase: lethev1.PhaseTombstoned, Time: metav1.NewTime(time.Unix(int64(1_800_000_000+i), 0).UTC()),
		EvidenceDigest: fmt.Sprintf("sha256:%064d", i), Digest: fmt.Sprintf("sha256:%064d", i+100),
	}
}

func TestHistoryIsAppendOnly(t *testing.T) {
	ctx := context.Background()
	newWithHistory := func(t *testing.T) *lethev1.ErasureRequest {
		r := validRequest()
		if err := k8s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		r.Status.EvidenceFormat, r.Status.History = "lethe.dev/evidence/v1", []lethev1.HistoryEntry{historyEntry(1), historyEntry(2)}
		if err := k8s.Status().Update(ctx, r); err != nil {
			t.Fatalf("first history write refused: %v", err)
		}
		return r
	}
	t.Run("append is admitted", func(t *testing.T) {
		r := newWithHistory(t)
		r.Status.History = append(r.Status.History, historyEntry(3))
		if err := k8s.Status().Update(ctx, r); err != nil {
			t.Fatal(err)
		}
	})
	tampering := map[string]func(*lethev1.ErasureRequest){
		"edit an entry":    func(r *lethev1.ErasureRequest) { r.Status.History[0].Phase = lethev1.PhaseCancelled },
		"drop an entry":    func(r *lethev1.ErasureRequest) { r.Status.History = r.Status.History[1:] },
		"drop the history": func(r *lethev1.ErasureRequest) { r.Status.History = nil },
		"drop the status":  func(r *lethev1.ErasureRequest) { r.Status = lethev1.ErasureRequestStatus{} },
		"replace entries": func(r *lethev1.ErasureRequest) {
			r.Status.History = []lethev1.HistoryEntry{historyEntry(7), historyEntry(8)}
		},
		"reorder entries": func(r *lethev1.ErasureRequest) {
			r.Status.History[0], r.Status.History[1] = r.Status.History[1], r.Status.History[0]
		},
		"insert an entry mid-list": func(r *lethev1.ErasureRequest) {
			h := r.Status.History
			r.Status.History = []lethev1.HistoryEntry{h[0], historyEntry(9), h[1]}
		},
		"insert an entry first": func(r *lethev1.ErasureRequest) {
			r.Status.History = append([]lethev1.HistoryEntry{historyEntry(9)}, r.Status.History...)
		},
		"reorder while appending": func(r *lethev1.ErasureRequest) {
			h := r.Status.History
			r.Status.History = []lethev1.HistoryEntry{h[1], h[0], historyEntry(3)}
		},
		"insert a duplicate of the first entry": func(r *lethev1.ErasureRequest) {
			h := r.Status.History
			r.Status.History = []lethev1.HistoryEntry{h[0], h[0], h[1]}
		},
	}
	for name, tamper := range tampering {
		t.Run(name, func(t *testing.T) {
			r := newWithHistory(t)
			tamper(r)
			refused(t, k8s.Status().Update(ctx, r), "status.history is append-only: the old history must stay an exact prefix")
		})
	}
	t.Run("drop the status through the main resource", func(t *testing.T) {
		r := newWithHistory(t)
		// The status subresource ignores status on the main resource, so history survives.
		r.Status = lethev1.ErasureRequestStatus{}
		if err := k8s.Update(ctx, r); err != nil {
			t.Fatal(err)
		}
		got := &lethev1.ErasureRequest{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(r), got); err != nil {
			t.Fatal(err)
		}
		if len(got.Status.History) != 2 {
			t.Fatalf("history lost through the main resource: %+v", got.Status.History)
		}
	})
}

// The evidence format is set once, with the first entry, and never changed
// or removed: a downgrade to the legacy (unkeyed) chain is refused.
func TestEvidenceFormatIsFixedOnceSet(t *testing.T) {
	ctx := context.Background()
	r := validRequest()
	if err := k8s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	e := historyEntry(1)
	e.EvidenceParts = map[string]string{"plan": fmt.Sprintf("sha256:%064d", 5)}
	legacy := r.DeepCopy()
	legacy.Status.History = []lethev1.HistoryEntry{e}
	refused(t, k8s.Status().Update(ctx, legacy), "a history begins with status.evidenceFormat")
	r.Status.EvidenceFormat, r.Status.History = "lethe.dev/evidence/v1", []lethev1.HistoryEntry{e}
	if err := k8s.Status().Update(ctx, r); err != nil {
		t.Fatalf("the first entry with its format: %v", err)
	}
	for name, tamper := range map[string]func(*lethev1.ErasureRequest){
		"downgraded to legacy": func(r *lethev1.ErasureRequest) { r.Status.EvidenceFormat = "" },
		"changed":              func(r *lethev1.ErasureRequest) { r.Status.EvidenceFormat = "lethe.dev/evidence/v0" },
		"entry's parts edited": func(r *lethev1.ErasureRequest) { r.Status.History[0].EvidenceParts["plan"] = "sha256:00" },
	} {
		t.Run(name, func(t *testing.T) {
			c := r.DeepCopy()
			tamper(c)
			if err := k8s.Status().Update(ctx, c); err == nil {
				t.Fatal("admitted")
			}
		})
	}
}

func TestStoreCreationIsValidated(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		mutate func(*lethev1.MemoryStore)
		want   []string
	}{
		"secret name with a slash": {func(s *lethev1.MemoryStore) { s.Spec.Postgres.DSNSecretRef.Name = "../other-ns/secret" },
			[]string{"spec.postgres.dsnSecretRef.name"}},
		"empty secret key": {func(s *lethev1.MemoryStore) { s.Spec.Postgres.DSNSecretRef.Key = "" },
			[]string{"spec.postgres.dsnSecretRef.key"}},
		"schema with SQL": {func(s *lethev1.MemoryStore) { s.Spec.Postgres.Schema = "memory; DROP SCHEMA memory" },
			[]string{"spec.postgres.schema"}},
		"negative rotation window": {func(s *lethev1.MemoryStore) {
			s.Spec.Velero = &lethev1.VeleroSpec{RotationWindow: &metav1.Duration{Duration: -time.Hour}}
		}, []string{"rotationWindow must be a non-negative Go duration"}},
		"negative retention floor": {func(s *lethev1.MemoryStore) {
			s.Spec.Velero = &lethev1.VeleroSpec{MinRetention: &metav1.Duration{Duration: -time.Hour}}
		}, []string{"minRetention must be a non-negative Go duration"}},
		"sweep interval too short": {func(s *lethev1.MemoryStore) {
			s.Spec.FalkorDB = &lethev1.FalkorDBSpec{URLSecretRef: lethev1.SecretKeyRef{Name: "f", Key: "url"}, SweepInterval: &metav1.Duration{Duration: time.Second}}
		}, []string{"sweepInterval must be a Go duration of at least 1m"}},
		"residue probe exclusion of three parts": {func(s *lethev1.MemoryStore) {
			s.Spec.Postgres.ResidueProbeExclude = []string{"analytics", "db.public.notes"}
		}, []string{"spec.postgres.residueProbeExclude[1]"}},
		"tenant with quotes": {func(s *lethev1.MemoryStore) { s.Spec.TenantID = "a' OR '1'='1" },
			[]string{"spec.tenantID"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := validStore()
			tc.mutate(s)
			refused(t, k8s.Create(ctx, s), tc.want...)
		})
	}
	t.Run("defaults", func(t *testing.T) {
		s := validStore()
		s.Spec.FalkorDB = &lethev1.FalkorDBSpec{URLSecretRef: lethev1.SecretKeyRef{Name: "f", Key: "url"}}
		s.Spec.Velero = &lethev1.VeleroSpec{}
		if err := k8s.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		if s.Spec.Postgres.Schema != "memory" || s.Spec.FalkorDB.Graph != "memory" ||
			s.Spec.FalkorDB.SweepInterval.Duration != 168*time.Hour || s.Spec.Velero.Namespace != "velero" ||
			s.Spec.Velero.RotationWindow.Duration != 720*time.Hour {
			t.Fatalf("defaults not applied: %+v %+v %+v", s.Spec.Postgres, *s.Spec.FalkorDB, *s.Spec.Velero)
		}
	})
}

func TestSamplesAreAdmitted(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "erasure_*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("want the samples in config/samples, found %v (%v)", files, err)
	}
	if err := k8s.Create(context.Background(), &corev1Namespace("samples").Unstructured); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(data, &u.Object); err != nil {
				t.Fatal(err)
			}
			u.SetNamespace("samples")
			if err := k8s.Create(context.Background(), u); err != nil {
				t.Fatalf("sample refused: %v", err)
			}
		})
	}
}

type namespace struct{ unstructured.Unstructured }

func corev1Namespace(name string) *namespace {
	n := &namespace{}
	n.SetAPIVersion("v1")
	n.SetKind("Namespace")
	n.SetName(name)
	return n
}
