package v1alpha1_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// The defaults the code falls back on are the ones the CRDs declare.
func TestDefaultsMatchTheCRDMarkers(t *testing.T) {
	cases := map[string]struct {
		crd  string
		path []string
		want any
	}{
		"schema":         {"memorystores", []string{"spec", "postgres", "schema"}, lethev1.DefaultSchema},
		"graph":          {"memorystores", []string{"spec", "falkordb", "graph"}, lethev1.DefaultGraph},
		"sweep interval": {"memorystores", []string{"spec", "falkordb", "sweepInterval"}, lethev1.DefaultSweepInterval},
		"velero ns":      {"memorystores", []string{"spec", "velero", "namespace"}, lethev1.DefaultVeleroNamespace},
		"rotation":       {"memorystores", []string{"spec", "velero", "rotationWindow"}, lethev1.DefaultRotationWindow},
		"grace period":   {"erasurerequests", []string{"spec", "gracePeriod"}, lethev1.DefaultGracePeriod},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", "erasure.lethe.dev_"+tc.crd+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.Unmarshal(raw, crd); err != nil {
				t.Fatal(err)
			}
			props := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
			for _, p := range tc.path {
				next, ok := props.Properties[p]
				if !ok {
					t.Fatalf("no property %s in the %s CRD", p, tc.crd)
				}
				props = &next
			}
			if props.Default == nil {
				t.Fatalf("the %s CRD declares no default at %v", tc.crd, tc.path)
			}
			var got string
			if err := json.Unmarshal(props.Default.Raw, &got); err != nil {
				t.Fatal(err)
			}
			want, ok := tc.want.(string)
			if d, isDuration := tc.want.(time.Duration); isDuration {
				parsed, err := time.ParseDuration(got)
				if err != nil || parsed != d {
					t.Fatalf("CRD default %q, code default %s", got, d)
				}
				return
			}
			if !ok || got != want {
				t.Fatalf("CRD default %q, code default %v", got, tc.want)
			}
		})
	}
}
