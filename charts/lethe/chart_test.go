// Package chart tests the Helm chart: helm lint, helm template, the rendered
// RBAC (no wildcards), and an install of its CRDs and RBAC into a real API
// server.
package chart

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/internal/testenv"
)

func helm(t *testing.T, args ...string) string {
	t.Helper()
	bin := os.Getenv("LETHE_HELM")
	if bin == "" {
		root, err := testenv.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(root, "bin", "helm")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm is not installed at %s: run `make helm` (make test does)", bin)
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String()
}

func render(t *testing.T, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", "lethe", ".", "--namespace", "lethe-system", "--kube-version", "1.37.2", "--include-crds",
		"--set", "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,manager.receiptKeySecret=lethe-receipt-key"}, extra...)
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(helm(t, args...)), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func TestHelmLint(t *testing.T) {
	out := helm(t, "lint", ".", "--strict", "--kube-version", "1.37.2")
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Fatalf("helm lint:\n%s", out)
	}
}

func TestRenderedRBACHasNoWildcardsAndTheDeploymentIsLockedDown(t *testing.T) {
	objs := render(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		if len(rules) == 0 {
			t.Errorf("%s %s has no rules", o.GetKind(), o.GetName())
		}
		for _, r := range rules {
			rule := r.(map[string]any)
			for _, field := range []string{"verbs", "resources", "apiGroups"} {
				vals, _, _ := unstructured.NestedStringSlice(rule, field)
				if slices.Contains(vals, "*") {
					t.Errorf("%s %s has a wildcard in %s: %v", o.GetKind(), o.GetName(), field, rule)
				}
			}
			if res, _, _ := unstructured.NestedStringSlice(rule, "resources"); slices.Contains(res, "secrets") {
				if verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs"); !slices.Equal(verbs, []string{"get"}) {
					t.Errorf("Secrets are read directly, one at a time: want verbs [get], got %v", verbs)
				}
			}
		}
	}
	for _, k := range []string{"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "Deployment", "Service", "ServiceMonitor", "PrometheusRule"} {
		if kinds[k] == 0 {
			t.Errorf("the chart renders no %s", k)
		}
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		c, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		sc := c[0].(map[string]any)["securityContext"].(map[string]any)
		if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false {
			t.Errorf("container securityContext %v", sc)
		}
		args, _, _ := unstructured.NestedStringSlice(c[0].(map[string]any), "args")
		if !slices.Contains(args, "--receipt-key-secret=lethe-system/lethe-receipt-key") {
			t.Errorf("args %v lack the receipt key", args)
		}
	}
}

func TestValuesSchemaRefusesUnknownValues(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "helm")
	if v := os.Getenv("LETHE_HELM"); v != "" {
		bin = v
	}
	out, err := exec.Command(bin, "template", "x", ".", "--kube-version", "1.37.2", "--set", "manager.deleteBatchSize=0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "deleteBatchSize") {
		t.Fatalf("a batch size of 0 was accepted: %v\n%s", err, out)
	}
}

func TestChartInstallsItsCRDsAndRBACIntoAnAPIServer(t *testing.T) {
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	c, err := client.New(cp.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "lethe-system"}}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	installed := 0
	for _, o := range render(t) {
		switch o.GetKind() {
		case "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount":
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("install %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			installed++
		}
	}
	if installed != 7 { // 2 CRDs, ClusterRole and binding, Role and binding, ServiceAccount
		t.Fatalf("installed %d objects", installed)
	}
}

// The manager binary accepts every argument the chart renders: it parses
// and validates them all, and stops only because there is no cluster to
// talk to (a renamed or unknown flag would stop it earlier, with usage).
func TestTheManagerAcceptsTheChartsArguments(t *testing.T) {
	var args []string
	for _, o := range render(t) {
		if o.GetKind() == "Deployment" {
			c, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			args, _, _ = unstructured.NestedStringSlice(c[0].(map[string]any), "args")
		}
	}
	if len(args) < 10 {
		t.Fatalf("the Deployment renders %d arguments: %v", len(args), args)
	}
	dir := t.TempDir()
	bin, err := testenv.BuildManager(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "none"), "KUBERNETES_SERVICE_HOST=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no Kubernetes configuration") {
		t.Fatalf("manager %s: %v, want it to stop for want of a cluster only:\n%s", strings.Join(args, " "), err, out)
	}
}
