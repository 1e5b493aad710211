// Package chart tests the Helm chart: helm lint, helm template (alone and as
// a subchart), the rendered RBAC (no wildcards), the values and their schema,
// the CRDs' keep policy, the helm test hook, and an install of its CRDs and
// RBAC into a real API server.
package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/internal/testenv"
)

func helmBin(t *testing.T) string {
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
	return bin
}

// helmCmd runs helm with its own config, cache and data folders (nothing
// read from or written to the user's).
func helmCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home+"/config", "HELM_CACHE_HOME="+home+"/cache", "HELM_DATA_HOME="+home+"/data")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String() + errOut.String(), err
}

func helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helmCmd(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// The options every render uses: the monitoring objects on.
var monitoringOn = []string{"--set", "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true"}

func render(t *testing.T, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderChart(t, ".", "lethe", append(slices.Clone(monitoringOn), extra...)...)
}

func renderChart(t *testing.T, dir, release string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", release, dir, "--namespace", "lethe-system", "--kube-version", "1.37.2"}, extra...)
	return decode(t, helm(t, args...))
}

func decode(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
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

func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func one(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	found := find(objs, kind)
	if len(found) != 1 {
		t.Fatalf("the chart renders %d %s, want 1", len(found), kind)
	}
	return found[0]
}

func managerContainer(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	c, _, _ := unstructured.NestedSlice(one(t, objs, "Deployment").Object, "spec", "template", "spec", "containers")
	if len(c) != 1 {
		t.Fatalf("the Deployment has %d containers", len(c))
	}
	return c[0].(map[string]any)
}

func TestHelmLint(t *testing.T) {
	out := helm(t, "lint", ".", "--strict", "--kube-version", "1.37.2")
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Fatalf("helm lint:\n%s", out)
	}
	out = helm(t, append([]string{"lint", ".", "--strict", "--kube-version", "1.37.2", "--set", "grafanaDashboard.enabled=true"}, monitoringOn...)...)
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Fatalf("helm lint with everything on:\n%s", out)
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
			res, _, _ := unstructured.NestedStringSlice(rule, "resources")
			if !slices.Contains(res, "secrets") {
				continue
			}
			verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
			switch o.GetKind() {
			case "ClusterRole": // cluster-wide, Secrets are read one at a time, and patched for a finalizer only (the policy below)
				if !slices.Equal(verbs, []string{"get", "patch"}) {
					t.Errorf("ClusterRole %s: want Secret verbs [get patch], got %v", o.GetName(), verbs)
				}
			case "Role": // the receipt key is created in the release namespace only
				if !slices.Equal(verbs, []string{"create"}) || o.GetNamespace() != "lethe-system" {
					t.Errorf("Role %s/%s: want Secret verbs [create] in lethe-system, got %v", o.GetNamespace(), o.GetName(), verbs)
				}
			}
		}
	}
	for _, k := range []string{"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "Deployment", "Service", "ServiceMonitor", "PrometheusRule", "Pod",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if kinds[k] == 0 {
			t.Errorf("the chart renders no %s", k)
		}
	}
	if kinds["Role"] != 2 || kinds["RoleBinding"] != 2 {
		t.Errorf("want 2 Roles and RoleBindings (leader election, receipt key), got %d and %d", kinds["Role"], kinds["RoleBinding"])
	}
	if kinds["ConfigMap"] != 0 {
		t.Errorf("the Grafana dashboard is rendered by default")
	}
	c := managerContainer(t, objs)
	sc := c["securityContext"].(map[string]any)
	if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false {
		t.Errorf("container securityContext %v", sc)
	}
	// Receipts are signed by default, with a key the manager may create.
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	for _, want := range []string{"--receipt-key-secret=lethe-system/lethe-receipt-key", "--receipt-key-create=true"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
}

func TestReceiptKeyValues(t *testing.T) {
	objs := render(t, "--set", "receiptKey.create=false,receiptKey.secretName=my-key")
	args, _, _ := unstructured.NestedStringSlice(managerContainer(t, objs), "args")
	if !slices.Contains(args, "--receipt-key-secret=lethe-system/my-key") || !slices.Contains(args, "--receipt-key-create=false") {
		t.Errorf("args %v", args)
	}
	for _, r := range find(objs, "Role") {
		if strings.HasSuffix(r.GetName(), "-receipt-key") {
			t.Errorf("receiptKey.create=false still renders the Role %s", r.GetName())
		}
	}
	args, _, _ = unstructured.NestedStringSlice(managerContainer(t, render(t, "--set", "receiptKey.secretName=")), "args")
	for _, a := range args {
		if strings.HasPrefix(a, "--receipt-key") {
			t.Errorf("an empty secretName (unsigned receipts) still renders %s", a)
		}
	}
}

// The settings a platform team sets per cluster reach the objects.
func TestPodAndServiceAccountSettingsAreRendered(t *testing.T) {
	values := `
extraArgs: ["--zap-log-level=debug", "--probe-timeout=20s"]
extraEnv:
  - name: HTTPS_PROXY
    value: http://proxy.internal:3128
  - name: FROM_SECRET
    valueFrom: {secretKeyRef: {name: s, key: k}}
podLabels: {team: privacy}
podAnnotations: {example.com/scrape: "no"}
serviceAccount:
  annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/lethe"}
priorityClassName: system-cluster-critical
metrics:
  serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}
  prometheusRule: {enabled: true, labels: {release: kube-prometheus-stack, role: alert-rules}}
`
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := renderChart(t, ".", "lethe", "-f", file)
	c := managerContainer(t, objs)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	if n := len(args); n < 2 || args[n-2] != "--zap-log-level=debug" || args[n-1] != "--probe-timeout=20s" {
		t.Errorf("extraArgs must come last (the last of a repeated flag wins): %v", args)
	}
	env, _, _ := unstructured.NestedSlice(c, "env")
	var names []string
	for _, e := range env {
		names = append(names, e.(map[string]any)["name"].(string))
	}
	if !slices.Equal(names, []string{"GOMEMLIMIT", "HTTPS_PROXY", "FROM_SECRET"}) {
		t.Errorf("env %v", env)
	}
	dep := one(t, objs, "Deployment")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	selector, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "selector", "matchLabels")
	if podLabels["team"] != "privacy" || selector["team"] != "" {
		t.Errorf("pod labels %v (selector %v): want team=privacy on the pods, not in the selector", podLabels, selector)
	}
	if a, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "annotations"); a["example.com/scrape"] != "no" {
		t.Errorf("pod annotations %v", a)
	}
	if p, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "priorityClassName"); p != "system-cluster-critical" {
		t.Errorf("priorityClassName %q", p)
	}
	if a := one(t, objs, "ServiceAccount").GetAnnotations(); a["eks.amazonaws.com/role-arn"] != "arn:aws:iam::123456789012:role/lethe" {
		t.Errorf("ServiceAccount annotations %v", a)
	}
	// kube-prometheus-stack selects ServiceMonitors and PrometheusRules by label.
	if l := one(t, objs, "ServiceMonitor").GetLabels(); l["release"] != "kube-prometheus-stack" || l["app.kubernetes.io/name"] != "lethe" {
		t.Errorf("ServiceMonitor labels %v", l)
	}
	if l := one(t, objs, "PrometheusRule").GetLabels(); l["release"] != "kube-prometheus-stack" || l["role"] != "alert-rules" {
		t.Errorf("PrometheusRule labels %v", l)
	}
	// Nothing of it by default.
	def := render(t)
	if _, ok, _ := unstructured.NestedString(one(t, def, "Deployment").Object, "spec", "template", "spec", "priorityClassName"); ok {
		t.Error("a priorityClassName is rendered by default")
	}
	if l := one(t, def, "ServiceMonitor").GetLabels(); l["release"] != "" {
		t.Errorf("default ServiceMonitor labels %v", l)
	}
}

// The alert rules group and name by the metrics' own namespace label (a
// request's or a store's). Without honorLabels, the Prometheus Operator's
// scrape sets namespace to the manager's and renames the metric's to
// exported_namespace: every alert would name the manager's namespace.
func TestServiceMonitorKeepsTheMetricsNamespace(t *testing.T) {
	eps, _, _ := unstructured.NestedSlice(one(t, render(t), "ServiceMonitor").Object, "spec", "endpoints")
	if len(eps) == 0 {
		t.Fatal("the ServiceMonitor has no endpoint")
	}
	for _, ep := range eps {
		if h, _ := ep.(map[string]any)["honorLabels"].(bool); !h {
			t.Errorf("ServiceMonitor endpoint %v: want honorLabels: true", ep)
		}
	}
}

// `helm test` runs a pod that asks the manager's metrics Service for an answer.
func TestHelmTestHookAsksTheManager(t *testing.T) {
	objs := render(t)
	pod := one(t, objs, "Pod")
	if pod.GetAnnotations()["helm.sh/hook"] != "test" {
		t.Fatalf("the Pod %s is not a helm test hook: %v", pod.GetName(), pod.GetAnnotations())
	}
	c, _, _ := unstructured.NestedSlice(pod.Object, "spec", "containers")
	ctr := c[0].(map[string]any)
	if ctr["image"] != "busybox:1.37.0" {
		t.Errorf("test image %v, want the pinned default busybox:1.37.0", ctr["image"])
	}
	env, _, _ := unstructured.NestedSlice(ctr, "env")
	url := env[0].(map[string]any)["value"].(string)
	svc := one(t, objs, "Service")
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	port := ports[0].(map[string]any)["port"]
	want := "http://" + svc.GetName() + ".lethe-system.svc:" + jsonString(port) + "/metrics"
	if url != want {
		t.Errorf("the test asks %s, want the metrics Service %s", url, want)
	}
	cmd, _, _ := unstructured.NestedStringSlice(ctr, "command")
	if !strings.Contains(strings.Join(cmd, " "), `wget`) || !strings.Contains(strings.Join(cmd, " "), "exit 1") {
		t.Errorf("the test's command %q cannot fail", cmd)
	}
	other := renderChart(t, ".", "lethe", "--set", "test.image.repository=registry.internal/busybox,test.image.tag=1.36.1")
	c, _, _ = unstructured.NestedSlice(one(t, other, "Pod").Object, "spec", "containers")
	if img := c[0].(map[string]any)["image"]; img != "registry.internal/busybox:1.36.1" {
		t.Errorf("test.image gives %v", img)
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// The CRDs are templates (upgraded with the release) kept on uninstall, and
// are exactly the generated ones of config/crd/bases.
func TestCRDsAreTheGeneratedOnesAndKept(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	generated, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(generated) == 0 {
		t.Fatalf("no generated CRDs: %v", err)
	}
	crds := find(render(t), "CustomResourceDefinition")
	if len(crds) != len(generated) {
		t.Fatalf("the chart renders %d CRDs, config/crd/bases has %d", len(crds), len(generated))
	}
	byName := map[string]*unstructured.Unstructured{}
	for _, c := range crds {
		byName[c.GetName()] = c
		if c.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s lacks helm.sh/resource-policy: keep: %v", c.GetName(), c.GetAnnotations())
		}
		if c.GetLabels()["app.kubernetes.io/name"] != "lethe" {
			t.Errorf("CRD %s labels %v", c.GetName(), c.GetLabels())
		}
	}
	for _, file := range generated {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		want := decode(t, string(raw))[0]
		got := byName[want.GetName()]
		if got == nil {
			t.Errorf("CRD %s is not rendered", want.GetName())
			continue
		}
		// Same schema, byte for byte once parsed (numbers, CEL rules, descriptions).
		if !reflect.DeepEqual(got.Object["spec"], want.Object["spec"]) {
			t.Errorf("the rendered CRD %s differs from %s: run make manifests", want.GetName(), file)
		}
		wantAnn := maps.Clone(want.GetAnnotations())
		wantAnn["helm.sh/resource-policy"] = "keep"
		if !maps.Equal(got.GetAnnotations(), wantAnn) {
			t.Errorf("CRD %s annotations %v, want %v", want.GetName(), got.GetAnnotations(), wantAnn)
		}
	}
	for _, c := range find(render(t, "--set", "crds.keep=false"), "CustomResourceDefinition") {
		if _, ok := c.GetAnnotations()["helm.sh/resource-policy"]; ok {
			t.Errorf("crds.keep=false: CRD %s still has the keep policy", c.GetName())
		}
	}
	if n := len(find(render(t, "--set", "crds.enabled=false"), "CustomResourceDefinition")); n != 0 {
		t.Errorf("crds.enabled=false renders %d CRDs", n)
	}
}

// A parent chart that depends on this one, passing global values (as
// umbrella charts do), renders: the schema admits global.
func TestChartRendersAsASubchartWithGlobalValues(t *testing.T) {
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	version := chartVersion(t)
	parent := t.TempDir()
	files := map[string]string{
		"Chart.yaml": "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: lethe\n    version: " + version +
			"\n    repository: file://" + here + "\n",
		"values.yaml": "global:\n  imageRegistry: registry.internal\n  labels: {cost-center: \"42\"}\n  anything: [1, 2]\n" +
			"lethe:\n  metrics:\n    serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(parent, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	helm(t, "dependency", "update", parent)
	objs := renderChart(t, parent, "platform", "--set", "global.extra=yes")
	if one(t, objs, "Deployment").GetName() != "platform-lethe" {
		t.Errorf("subchart Deployment named %s", one(t, objs, "Deployment").GetName())
	}
	if l := one(t, objs, "ServiceMonitor").GetLabels(); l["release"] != "kube-prometheus-stack" {
		t.Errorf("values passed by the parent are lost: %v", l)
	}
	if len(find(objs, "CustomResourceDefinition")) != 2 {
		t.Errorf("the subchart renders %d CRDs", len(find(objs, "CustomResourceDefinition")))
	}
}

func chartVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "version: "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("Chart.yaml has no version")
	return ""
}

func TestValuesSchemaRefusesUnknownValuesAndWrongTypes(t *testing.T) {
	for _, c := range []struct{ set, want string }{
		{"manager.deleteBatchSize=0", "deleteBatchSize"},
		{"crds.keep=yes", "keep"},
		{"extraArgs=--zap-log-level=debug", "extraArgs"},
		{"metrics.serviceMonitor.labels.release=1", "release"},
		{"podLabels.team=true", "team"},
		{"receiptKey.secretName=Not_A_Name", "secretName"},
		{"receiptKeySecret=x", "receiptKeySecret"},
		{"serviceAccount.name=x", "name"},
	} {
		out, err := helmCmd(t, "template", "x", ".", "--kube-version", "1.37.2", "--set", c.set)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("--set %s was accepted or refused without naming %s: %v\n%s", c.set, c.want, err, out)
		}
	}
}

// The dashboard ConfigMap carries the file `make manifests` copies, with
// the label the Grafana sidecar looks for.
func TestGrafanaDashboardConfigMap(t *testing.T) {
	dir := copyChart(t)
	dashboard := filepath.Join(dir, "files", "grafana-dashboard.json")
	want, err := os.ReadFile(dashboard)
	if errors.Is(err, os.ErrNotExist) { // not generated yet: a placeholder, in the copy only
		want = []byte("{}")
		err = os.WriteFile(dashboard, want, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	objs := renderChart(t, dir, "lethe", "--set", "grafanaDashboard.enabled=true,grafanaDashboard.annotations.grafana_folder=Lethe")
	cm := one(t, objs, "ConfigMap")
	if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] != "Lethe" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v", cm.GetLabels(), cm.GetAnnotations())
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	var got, wantJSON any
	if err := json.Unmarshal([]byte(data["lethe-dashboard.json"]), &got); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if err := json.Unmarshal(want, &wantJSON); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantJSON) {
		t.Error("the ConfigMap's dashboard differs from files/grafana-dashboard.json")
	}
	if err := os.Remove(dashboard); err != nil {
		t.Fatal(err)
	}
	out, err := helmCmd(t, "template", "x", dir, "--kube-version", "1.37.2", "--set", "grafanaDashboard.enabled=true")
	if err == nil || !strings.Contains(out, "make manifests") {
		t.Errorf("a missing dashboard file was not refused clearly: %v\n%s", err, out)
	}
}

// copyChart copies the chart (templates, files, metadata) into a temp dir.
func copyChart(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".go") {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(path)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, path), raw, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// NOTES.txt tells the next steps of this release (helm renders the notes
// only for an install, which asks an API server for its version).
func TestNotesNameTheReleasesKeyAndFirstSteps(t *testing.T) {
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out := helm(t, "install", "lethe", ".", "--dry-run=client", "--namespace", "privacy", "--kubeconfig", kubeconfig)
	notes := out[strings.Index(out, "NOTES:"):]
	for _, want := range []string{
		"kubectl -n privacy get configmap lethe-receipt-key",
		"helm test lethe -n privacy",
		"kubectl krew install",
		"kubectl erasure plan",
		"kubectl erasure create",
		"helm.sh/resource-policy: keep",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES lack %q:\n%s", want, notes)
		}
	}
	out = helm(t, "install", "lethe", ".", "--dry-run=client", "--namespace", "privacy", "--kubeconfig", kubeconfig, "--set", "receiptKey.secretName=")
	if !strings.Contains(out[strings.Index(out, "NOTES:"):], "UNSIGNED") {
		t.Errorf("NOTES do not say that receipts are unsigned:\n%s", out)
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
		case "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("install %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			installed++
		}
	}
	if installed != 11 { // 2 CRDs, ClusterRole and binding, 2 Roles and bindings, ServiceAccount, the Secret policy and binding
		t.Fatalf("installed %d objects", installed)
	}
	checkSecretPolicy(t, cp.Config, c)
}

// The manager binary accepts every argument the chart renders: it parses
// and validates them all, and stops only because there is no cluster to
// talk to (a renamed or unknown flag would stop it earlier, with usage).
func TestTheManagerAcceptsTheChartsArguments(t *testing.T) {
	args, _, _ := unstructured.NestedStringSlice(managerContainer(t, render(t)), "args")
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
