// Package argocd holds Lethe's Argo CD health checks, laid out as in Argo
// CD's own repository (resource_customizations/GROUP/KIND/{health.lua,
// health_test.yaml,testdata/}) so they can be contributed upstream. This test
// runs every case of every health_test.yaml with gopher-lua, as Argo CD does.
package argocd

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

const root = "resource_customizations"

// healthTests is health_test.yaml, in Argo CD's format.
type healthTests struct {
	Tests []struct {
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
		InputPath string `json:"inputPath"`
	} `json:"tests"`
}

// validStatus are the health codes Argo CD accepts from a script.
var validStatus = []string{"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

// TestHealthScriptsFromTheUpstreamLayout runs every case of every
// health_test.yaml, comparing status and message exactly, as Argo CD's
// TestLuaHealthScript does. It fails when a file the layout needs is missing,
// when a testdata file is not used by any case, and when a testdata object is
// not a valid Lethe object (a typo would otherwise test nothing).
func TestHealthScriptsFromTheUpstreamLayout(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := lethev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "health.lua" {
			return err
		}
		dir := filepath.Dir(path)
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		group, kind := filepath.Dir(rel), filepath.Base(rel)
		gvk := schema.GroupVersionKind{Group: group, Version: lethev1.GroupVersion.Version, Kind: kind}
		if !scheme.Recognizes(gvk) {
			return fmt.Errorf("%s: no such Lethe kind %s", dir, gvk)
		}
		kinds[kind] = true
		t.Run(rel, func(t *testing.T) { runHealthTests(t, scheme, gvk, dir) })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ErasureRequest", "MemoryStore"} {
		if !kinds[k] {
			t.Errorf("no %s/erasure.lethe.dev/%s/health.lua", root, k)
		}
	}
}

func runHealthTests(t *testing.T, scheme *runtime.Scheme, gvk schema.GroupVersionKind, dir string) {
	script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		t.Fatalf("every health.lua needs its health_test.yaml: %v", err)
	}
	var tests healthTests
	if err := yaml.UnmarshalStrict(raw, &tests); err != nil {
		t.Fatalf("health_test.yaml: %v", err)
	}
	if len(tests.Tests) == 0 {
		t.Fatal("health_test.yaml has no tests")
	}
	used := map[string]bool{}
	statuses := map[string]bool{}
	for _, tc := range tests.Tests {
		used[filepath.Clean(tc.InputPath)] = true
		statuses[tc.HealthStatus.Status] = true
		t.Run(tc.InputPath, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join(dir, tc.InputPath))
			if err != nil {
				t.Fatalf("the case's input is missing: %v", err)
			}
			obj := map[string]any{}
			if err := yaml.Unmarshal(in, &obj); err != nil {
				t.Fatal(err)
			}
			typed, err := scheme.New(gvk)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.UnmarshalStrict(in, typed); err != nil {
				t.Fatalf("not a valid %s: %v", gvk.Kind, err)
			}
			if obj["kind"] != gvk.Kind {
				t.Fatalf("kind %v in the %s directory", obj["kind"], gvk.Kind)
			}
			status, message := runHealth(t, string(script), obj)
			if !slices.Contains(validStatus, status) {
				t.Fatalf("status %q is not one Argo CD accepts (%v)", status, validStatus)
			}
			if status != tc.HealthStatus.Status || message != tc.HealthStatus.Message {
				t.Errorf("got %s %q\nwant %s %q", status, message, tc.HealthStatus.Status, tc.HealthStatus.Message)
			}
		})
	}
	inputs, err := filepath.Glob(filepath.Join(dir, "testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range inputs {
		rel, _ := filepath.Rel(dir, in)
		if !used[rel] {
			t.Errorf("%s is used by no case of health_test.yaml", rel)
		}
	}
	if gvk.Kind == "ErasureRequest" {
		requireErasureCoverage(t, dir, tests, statuses)
	}
}

// requireErasureCoverage keeps the ErasureRequest cases covering every
// phase, a request with no status yet, and every health Lethe can report.
func requireErasureCoverage(t *testing.T, dir string, tests healthTests, statuses map[string]bool) {
	for _, s := range []string{"Healthy", "Progressing", "Degraded", "Suspended"} {
		if !statuses[s] {
			t.Errorf("no ErasureRequest case is %s", s)
		}
	}
	phases := map[string]bool{}
	for _, tc := range tests.Tests {
		in, err := os.ReadFile(filepath.Join(dir, tc.InputPath))
		if err != nil {
			continue // reported by the case itself
		}
		var er lethev1.ErasureRequest
		if err := yaml.Unmarshal(in, &er); err != nil {
			continue
		}
		phases[string(er.Status.Phase)] = true
	}
	for _, p := range []lethev1.Phase{"", lethev1.PhasePending, lethev1.PhasePlanned, lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod,
		lethev1.PhaseDeleted, lethev1.PhaseGraphReconciled, lethev1.PhaseBackupsRotated, lethev1.PhaseCancelled} {
		if !phases[string(p)] {
			t.Errorf("no ErasureRequest case in phase %q (\"\": no status yet)", p)
		}
	}
}

// runHealth runs script with the global obj set, as Argo CD's Lua VM does,
// with only the libraries Argo CD opens for health scripts.
func runHealth(t *testing.T, script string, obj map[string]any) (status, message string) {
	t.Helper()
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	L.SetGlobal("obj", toLua(t, L, obj))
	if err := L.DoString(script); err != nil {
		t.Fatalf("health.lua: %v", err)
	}
	hs, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("health.lua returned %s, want a table", L.Get(-1).Type())
	}
	s, ok := hs.RawGetString("status").(lua.LString)
	if !ok {
		t.Fatalf("health.lua returned no status string")
	}
	m := hs.RawGetString("message")
	if m == lua.LNil {
		return string(s), ""
	}
	return string(s), m.String()
}

// toLua converts a decoded YAML object to Lua values as Argo CD does.
func toLua(t *testing.T, L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case string:
		return lua.LString(x)
	case bool:
		return lua.LBool(x)
	case int64:
		return lua.LNumber(x)
	case float64:
		return lua.LNumber(x)
	case map[string]any:
		tbl := L.NewTable()
		for k, e := range x {
			tbl.RawSetString(k, toLua(t, L, e))
		}
		return tbl
	case []any:
		tbl := L.NewTable()
		for _, e := range x {
			tbl.Append(toLua(t, L, e))
		}
		return tbl
	}
	t.Fatalf("unexpected YAML value %T", v)
	return lua.LNil
}
