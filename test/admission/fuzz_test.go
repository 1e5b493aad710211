// Package admission fuzzes the ErasureRequest admission rules in-process:
// the CRD's OpenAPI schema and its CEL rules, compiled and evaluated by the
// API server's own libraries (apiextensions-apiserver), so that the fuzzing
// engine can run them without a control plane per worker. The same inputs
// go through the real API server in api/v1alpha1's FuzzAdmission seeds.
package admission

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/lethe-dev/lethe/internal/testenv"
)

// rules is the ErasureRequest CRD's schema, compiled once.
type rules struct {
	structural *schema.Structural
	openAPI    validation.SchemaValidator
	cel        *cel.Validator
}

var (
	loadOnce sync.Once
	loaded   *rules
	loadErr  error
)

func load(t testing.TB) *rules {
	t.Helper()
	loadOnce.Do(func() { loaded, loadErr = compile() })
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return loaded
}

func compile() (*rules, error) {
	dir, err := testenv.LetheCRDDir()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "erasure.lethe.dev_erasurerequests.yaml"))
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(raw, crd); err != nil {
		return nil, err
	}
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, internal, nil); err != nil {
		return nil, err
	}
	s, err := schema.NewStructural(internal)
	if err != nil {
		return nil, err
	}
	openAPI, _, err := validation.NewSchemaValidator(internal)
	if err != nil {
		return nil, err
	}
	return &rules{structural: s, openAPI: openAPI, cel: cel.NewValidator(s, true, celconfig.PerCallLimit)}, nil
}

// admit runs what the API server runs on a create: the schema, list-type
// uniqueness (sessionIDs is a set), then the CEL rules.
func (r *rules) admit(obj map[string]any) field.ErrorList {
	errs := validation.ValidateCustomResource(nil, obj, r.openAPI)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, r.structural, obj)...)
	celErrs, _ := r.cel.Validate(context.Background(), nil, r.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

func request(a, b string, immediate bool, reason, grace string) map[string]any {
	spec := map[string]any{
		"storeRef":   map[string]any{"name": "memory"},
		"sessionIDs": []any{a, b},
		"immediate":  immediate,
	}
	if reason != "" {
		spec["reason"] = reason
	}
	if grace != "" {
		spec["gracePeriod"] = grace
	}
	return map[string]any{
		"apiVersion": "erasure.lethe.dev/v1alpha1", "kind": "ErasureRequest",
		"metadata": map[string]any{"name": "fuzz", "namespace": "default"},
		"spec":     spec,
	}
}

var (
	canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	goDuration    = regexp.MustCompile(`^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$`)
)

// wantAdmitted is the documented rule set, written independently of the CRD.
func wantAdmitted(a, b string, immediate bool, reason, grace string) bool {
	graceOK := grace == ""
	if !graceOK && len(grace) <= 32 && goDuration.MatchString(grace) {
		d, err := time.ParseDuration(grace)
		// No grace period at all is for immediate requests only.
		graceOK = err == nil && (d > 0 || immediate)
	}
	return canonicalUUID.MatchString(a) && canonicalUUID.MatchString(b) && a != b &&
		(!immediate || strings.TrimSpace(reason) != "") && utf8.RuneCountInString(reason) <= 1024 && graceOK
}

// FuzzAdmissionRules: a request passes the CRD's schema and CEL rules
// exactly when the documented rules say it should — canonical lowercase
// UUIDs, no duplicate, a reason for an immediate request, a grace period
// that is a non-negative Go duration — and no input makes the evaluation
// panic. Strings arrive as JSON would carry them (valid UTF-8).
func FuzzAdmissionRules(f *testing.F) {
	f.Add("6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f", false, "", "168h")
	f.Add("'; DELETE FROM memory.sessions; --", "x", true, "r", "1h")
	f.Add("6F1C2A4E-8B3D-4F5A-9C7E-1D2B3A4C5E6F", "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", true, " ", "-1h")
	f.Add("6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", false, "", "0s")
	f.Add("6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f", true, "\u00a0\u3000", "1.5h30m")
	f.Add("6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f\n", "0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f", false, "", "99999999999999h")
	r := load(f)
	f.Fuzz(func(t *testing.T, a, b string, immediate bool, reason, grace string) {
		for _, s := range []string{a, b, reason, grace} {
			if !utf8.ValidString(s) {
				return // a JSON client cannot send it
			}
		}
		errs := r.admit(request(a, b, immediate, reason, grace))
		if want := wantAdmitted(a, b, immediate, reason, grace); want != (len(errs) == 0) {
			t.Fatalf("ids %q %q immediate %v reason %q grace %q: want admitted=%v, got %v", a, b, immediate, reason, grace, want, errs)
		}
	})
}

// The seeds' outcomes, stated: the compiled rules admit the valid request
// and refuse each invalid one with a message about what is wrong.
func TestAdmissionRulesSayWhatIsWrong(t *testing.T) {
	r := load(t)
	valid := "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f"
	other := "0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f"
	if errs := r.admit(request(valid, other, false, "", "168h")); len(errs) != 0 {
		t.Fatalf("a valid request was refused: %v", errs)
	}
	for _, tc := range []struct {
		obj  map[string]any
		want string
	}{
		{request(strings.ToUpper(valid), other, false, "", ""), "lowercase canonical form"},
		{request(valid, valid, false, "", ""), "Duplicate value"},
		{request(valid, other, true, "  ", ""), "spec.reason is required when spec.immediate is true"},
		{request(valid, other, false, "", "-1h"), "gracePeriod must be a non-negative Go duration"},
		{request(valid, other, false, "", "0s"), "gracePeriod 0s skips the grace period"},
		{request(valid, other, false, "", "1 week"), "gracePeriod must be a non-negative Go duration"},
	} {
		errs := r.admit(tc.obj)
		if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
			t.Errorf("%v: want an error saying %q, got %v", tc.obj["spec"], tc.want, errs)
		}
	}
}
