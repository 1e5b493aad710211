// Package flux holds an example Flux Kustomization for ErasureRequests; this
// test checks what Flux will report for a request in every phase: kstatus
// (the library Flux's health checks use) on Lethe's Ready, Stalled and
// Reconciling conditions, and the example's healthCheckExprs, evaluated as
// Flux evaluates them. The objects are the Argo CD health tests' testdata.
package flux

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

const testdata = "../argocd/resource_customizations/erasure.lethe.dev/ErasureRequest/testdata"

// want is what Flux reports for each testdata object: plain kstatus (wait:
// true or healthChecks without expressions) and with the example's
// healthCheckExprs. "error" means the expressions cannot be evaluated yet
// (no status): Flux keeps waiting.
var want = map[string]struct{ kstatus, exprs string }{
	// kstatus counts an object without conditions or observedGeneration as
	// Current: for the moment before Lethe's first pass, plain kstatus says Current.
	"progressing_noStatus.yaml":        {"Current", "error"},
	"progressing_staleGeneration.yaml": {"InProgress", "InProgress"},
	"progressing_pending.yaml":         {"InProgress", "InProgress"},
	"suspended_gracePeriod.yaml":       {"InProgress", "Current"},
	"progressing_deleting.yaml":        {"InProgress", "InProgress"},
	"progressing_graphPruning.yaml":    {"InProgress", "InProgress"},
	"suspended_backupsExpiring.yaml":   {"InProgress", "Current"},
	"healthy_backupsRotated.yaml":      {"Current", "Current"},
	"healthy_planned.yaml":             {"Current", "Current"},
	"healthy_cancelled.yaml":           {"Current", "Current"},
	"degraded_stalledResidue.yaml":     {"Failed", "Failed"},
	"degraded_storeNotFound.yaml":      {"Failed", "Failed"},
}

func TestWhatFluxReportsInEveryPhase(t *testing.T) {
	exprs := healthCheckExprs(t)
	files, err := filepath.Glob(filepath.Join(testdata, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata in %s: %v", testdata, err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		seen[name] = true
		w, ok := want[name]
		if !ok {
			t.Errorf("%s: no expectation; add it to want", name)
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// Decoded as a client decodes the API server's JSON (integers as int64).
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res, err := status.Compute(u)
		if err != nil {
			t.Fatalf("%s: kstatus: %v", name, err)
		}
		if string(res.Status) != w.kstatus {
			t.Errorf("%s: kstatus %s (%s), want %s", name, res.Status, res.Message, w.kstatus)
		}
		if got := exprs.evaluate(u.Object); got != w.exprs {
			t.Errorf("%s: healthCheckExprs %s, want %s", name, got, w.exprs)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s: expected but not in testdata", name)
		}
	}
}

// statusExprs are one healthCheckExprs entry, compiled.
type statusExprs struct{ inProgress, failed, current cel.Program }

// healthCheckExprs reads the ErasureRequest entry of the example
// Kustomization and compiles it in the CEL environment Flux uses
// (fluxcd/pkg/runtime/cel: the same options, expressions parsed, not type-checked).
func healthCheckExprs(t *testing.T) statusExprs {
	t.Helper()
	raw, err := os.ReadFile("flux-kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ks struct {
		Kind string `json:"kind"`
		Spec struct {
			HealthCheckExprs []struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				InProgress string `json:"inProgress"`
				Failed     string `json:"failed"`
				Current    string `json:"current"`
			} `json:"healthCheckExprs"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &ks); err != nil {
		t.Fatal(err)
	}
	env, err := cel.NewEnv(cel.HomogeneousAggregateLiterals(), cel.EagerlyValidateDeclarations(true),
		cel.DefaultUTCTimeZone(true), cel.CrossTypeNumericComparisons(true), cel.OptionalTypes(),
		ext.Strings(), ext.Sets(), ext.Encoders())
	if err != nil {
		t.Fatal(err)
	}
	compile := func(expr string) cel.Program {
		if expr == "" {
			return nil
		}
		ast, issues := env.Parse(expr)
		if issues != nil && issues.Err() != nil {
			t.Fatalf("%q: %v", expr, issues.Err())
		}
		prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.InterruptCheckFrequency(100))
		if err != nil {
			t.Fatal(err)
		}
		return prg
	}
	for _, e := range ks.Spec.HealthCheckExprs {
		if e.APIVersion == "erasure.lethe.dev/v1alpha1" && e.Kind == "ErasureRequest" {
			if e.Current == "" {
				t.Fatal("healthCheckExprs: current is required")
			}
			return statusExprs{compile(e.InProgress), compile(e.Failed), compile(e.Current)}
		}
	}
	t.Fatalf("%s has no healthCheckExprs for erasure.lethe.dev/v1alpha1 ErasureRequest", "flux-kustomization.yaml")
	return statusExprs{}
}

// evaluate follows Flux's StatusEvaluator: an unobserved generation is
// InProgress; then inProgress, failed, current in that order; none true is
// InProgress; an evaluation error leaves the status unknown ("error").
func (s statusExprs) evaluate(obj map[string]any) string {
	gen, hasGen, _ := unstructured.NestedInt64(obj, "metadata", "generation")
	if observed, ok, _ := unstructured.NestedInt64(obj, "status", "observedGeneration"); ok && hasGen && observed != gen {
		return "InProgress"
	}
	for _, e := range []struct {
		prg    cel.Program
		status string
	}{{s.inProgress, "InProgress"}, {s.failed, "Failed"}, {s.current, "Current"}} {
		if e.prg == nil {
			continue
		}
		v, _, err := e.prg.ContextEval(context.Background(), obj)
		if err != nil {
			return "error"
		}
		b, ok := v.(types.Bool)
		if !ok {
			return "error"
		}
		if b {
			return e.status
		}
	}
	return "InProgress"
}
