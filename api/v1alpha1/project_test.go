package v1alpha1_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// TestProjectFileDescribesTheTree keeps the kubebuilder PROJECT file true:
// one resource per CRD in config/crd/bases, with its group, version, scope and
// Go package; a controller exactly where controllers/ has one; no webhooks.
func TestProjectFileDescribesTheTree(t *testing.T) {
	raw, err := os.ReadFile("../../PROJECT")
	if err != nil {
		t.Fatal(err)
	}
	var project struct {
		Domain      string   `json:"domain"`
		Layout      []string `json:"layout"`
		ProjectName string   `json:"projectName"`
		Repo        string   `json:"repo"`
		Version     string   `json:"version"`
		Resources   []struct {
			API *struct {
				CRDVersion string `json:"crdVersion"`
				Namespaced bool   `json:"namespaced"`
			} `json:"api"`
			Controller bool           `json:"controller"`
			Domain     string         `json:"domain"`
			Group      string         `json:"group"`
			Kind       string         `json:"kind"`
			Path       string         `json:"path"`
			Version    string         `json:"version"`
			Webhooks   map[string]any `json:"webhooks"`
		} `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(raw, &project); err != nil {
		t.Fatalf("PROJECT: %v", err)
	}
	if project.Version != "3" || project.Repo != "github.com/lethe-dev/lethe" || project.ProjectName != "lethe" ||
		len(project.Layout) != 1 || project.Layout[0] != "go.kubebuilder.io/v4" {
		t.Errorf("PROJECT version %q repo %q name %q layout %v", project.Version, project.Repo, project.ProjectName, project.Layout)
	}
	crds, err := filepath.Glob("../../config/crd/bases/*.yaml")
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in config/crd/bases: %v", err)
	}
	listed := map[string]bool{}
	for _, r := range project.Resources {
		listed[r.Kind] = true
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatal(err)
		}
		if !listed[crd.Spec.Names.Kind] {
			t.Errorf("PROJECT does not list %s", crd.Spec.Names.Kind)
		}
		for _, r := range project.Resources {
			if r.Kind != crd.Spec.Names.Kind {
				continue
			}
			if r.Group+"."+r.Domain != crd.Spec.Group || r.Domain != project.Domain {
				t.Errorf("%s: group %s.%s, CRD says %s", r.Kind, r.Group, r.Domain, crd.Spec.Group)
			}
			if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != r.Version || r.Version != lethev1.GroupVersion.Version {
				t.Errorf("%s: version %s, CRD serves %v", r.Kind, r.Version, crd.Spec.Versions)
			}
			if r.API == nil || r.API.CRDVersion != "v1" || r.API.Namespaced != (crd.Spec.Scope == apiextensionsv1.NamespaceScoped) {
				t.Errorf("%s: api %+v, CRD scope %s", r.Kind, r.API, crd.Spec.Scope)
			}
			if r.Path != project.Repo+"/api/"+r.Version {
				t.Errorf("%s: path %s", r.Kind, r.Path)
			}
			_, err := os.Stat("../../controllers/" + strings.ToLower(r.Kind) + "_controller.go")
			if r.Controller != (err == nil) {
				t.Errorf("%s: PROJECT says controller %v, controllers/ disagrees (%v)", r.Kind, r.Controller, err)
			}
			if r.Webhooks != nil {
				t.Errorf("%s: PROJECT lists webhooks; Lethe has none", r.Kind)
			}
		}
	}
	if len(project.Resources) != len(crds) {
		t.Errorf("PROJECT lists %d resources for %d CRDs", len(project.Resources), len(crds))
	}
}
