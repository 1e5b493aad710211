package v1alpha1_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// sessionIDRule is the CEL rule that admits exactly SessionIDPattern.
var sessionIDRule = "self.matches('" + lethev1.SessionIDPattern + "')"

// TestSessionIDMarkerIsThePattern: the XValidation marker on the
// SessionID type spells out SessionIDPattern exactly.
func TestSessionIDMarkerIsThePattern(t *testing.T) {
	src, err := os.ReadFile("erasurerequest_types.go")
	if err != nil {
		t.Fatal(err)
	}
	// The comment block right above `type SessionID string`.
	text := string(src)
	end := strings.Index(text, "\ntype SessionID string")
	if end < 0 {
		t.Fatal("erasurerequest_types.go no longer declares `type SessionID string`")
	}
	var markers []string
	lines := strings.Split(text[:end], "\n")
	for i := len(lines) - 1; i >= 0 && strings.HasPrefix(lines[i], "//"); i-- {
		if strings.Contains(lines[i], "+kubebuilder:validation:XValidation:rule=") {
			markers = append(markers, lines[i])
		}
	}
	if len(markers) != 1 {
		t.Fatalf("SessionID carries %d XValidation markers, want 1: %q", len(markers), markers)
	}
	rule := regexp.MustCompile(`rule="([^"]*)"`).FindStringSubmatch(markers[0])
	if rule == nil || rule[1] != sessionIDRule {
		t.Fatalf("SessionID's marker rule is %q, want %q (lethev1.SessionIDPattern)", rule, sessionIDRule)
	}
}

// TestGeneratedCRDsCheckSessionIDsWithThePattern: every session ID list in
// the generated CRDs (and the chart's copies) is validated with exactly the
// rule built from SessionIDPattern, and no other rule mentions a UUID.
func TestGeneratedCRDsCheckSessionIDsWithThePattern(t *testing.T) {
	for _, f := range []string{
		"../../config/crd/bases/erasure.lethe.dev_erasurerequests.yaml",
		"../../charts/lethe/files/crds/erasure.lethe.dev_erasurerequests.yaml",
	} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var found int
		for _, v := range crd.Spec.Versions {
			walk(v.Schema.OpenAPIV3Schema, v.Name, func(path string, s *apiextensionsv1.JSONSchemaProps) {
				for _, r := range s.XValidations {
					isSessionID := strings.HasPrefix(s.Description, "SessionID is")
					if isSessionID && r.Rule != sessionIDRule {
						t.Errorf("%s %s: rule %q, want %q", filepath.Base(f), path, r.Rule, sessionIDRule)
					}
					if !isSessionID && strings.Contains(r.Rule, "[0-9a-f]{8}") {
						t.Errorf("%s %s: a UUID rule outside SessionID: %q", filepath.Base(f), path, r.Rule)
					}
					if isSessionID {
						found++
					}
				}
			})
		}
		if found == 0 {
			t.Errorf("%s: no SessionID validation found", f)
		}
	}
}

// walk calls fn on s and every schema below it.
func walk(s *apiextensionsv1.JSONSchemaProps, path string, fn func(string, *apiextensionsv1.JSONSchemaProps)) {
	if s == nil {
		return
	}
	fn(path, s)
	for name, p := range s.Properties {
		walk(&p, path+"."+name, fn)
	}
	if s.Items != nil {
		walk(s.Items.Schema, path+"[]", fn)
		for i := range s.Items.JSONSchemas {
			walk(&s.Items.JSONSchemas[i], path+"[]", fn)
		}
	}
	if s.AdditionalProperties != nil {
		walk(s.AdditionalProperties.Schema, path+"{}", fn)
	}
}

func TestSessionIDPatternAdmitsOnlyLowercaseCanonicalUUIDs(t *testing.T) {
	re := regexp.MustCompile(lethev1.SessionIDPattern)
	for id, want := range map[string]bool{
		"0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f":   true,
		"0B5C1F5E-3D2A-4C8E-9F10-2A6B7C8D9E0F":   false,
		"0b5c1f5e3d2a4c8e9f102a6b7c8d9e0f":       false,
		"{0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f}": false,
		"0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f\n": false,
		"":                                       false,
	} {
		if re.MatchString(id) != want {
			t.Errorf("%q: match %v, want %v", id, !want, want)
		}
	}
}
