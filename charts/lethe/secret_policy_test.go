package chart

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// secretFinalizer is a store's finalizer on a Secret it reads.
var secretFinalizer = controllers.SecretFinalizerPrefix + "4d7a3a9e-1b8e-4f5e-9a57-6f4f3c2b1a00"

// checkSecretPolicy checks, in an API server the chart's RBAC and Secret
// policy are installed in, that the manager's service account (by the
// ClusterRole the chart grants it) may put its finalizer on a Secret and
// take it off, and may change nothing else of it; an administrator still
// may.
func checkSecretPolicy(t *testing.T, admin *rest.Config, c client.Client) {
	t.Helper()
	ctx := context.Background()
	tenant := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}
	if err := c.Create(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "pg", Labels: map[string]string{"app": "memory"},
		Finalizers: []string{"example.com/keep"}}, Data: map[string][]byte{"dsn": []byte("postgres://a")}}
	if err := c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:lethe-system:lethe"}
	mgr, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	patch := func(c client.Client, body string) error {
		return c.Patch(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "pg"}}, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	denied := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "may change only its own finalizer")
	}

	// The policy takes effect once the API server has compiled it. Each try
	// writes a new value: one the Secret already holds is no change.
	changeData := func(i int) string {
		return fmt.Sprintf(`{"data":{"dsn":%q}}`, base64.StdEncoding.EncodeToString(fmt.Appendf(nil, "postgres://other-%d", i)))
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; !denied(patch(mgr, changeData(i))); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the manager changed a Secret's data for 30 s (%d tries): the policy never took effect", i+1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// What got through before the policy took effect is put back.
	if err := patch(c, `{"data":{"dsn":"cG9zdGdyZXM6Ly9h"}}`); err != nil {
		t.Fatal(err)
	}

	allowed := map[string]string{
		"add its finalizer":    fmt.Sprintf(`{"metadata":{"finalizers":["example.com/keep","%s"]}}`, secretFinalizer),
		"remove its finalizer": `{"metadata":{"finalizers":["example.com/keep"]}}`,
	}
	for _, what := range []string{"add its finalizer", "remove its finalizer"} {
		if err := patch(mgr, allowed[what]); err != nil {
			t.Errorf("the manager may not %s: %v", what, err)
		}
	}
	// Lethe's own patches (patchFinalizers): the whole list and the
	// resourceVersion; the last finalizer taken off sends null.
	solo := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "solo"}, Data: map[string][]byte{"dsn": []byte("postgres://b")}}
	if err := c.Create(ctx, solo); err != nil {
		t.Fatal(err)
	}
	for _, finalizers := range []any{[]string{secretFinalizer}, nil} {
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": finalizers, "resourceVersion": solo.ResourceVersion}})
		if err != nil {
			t.Fatal(err)
		}
		if err := mgr.Patch(ctx, solo, client.RawPatch(types.MergePatchType, body)); err != nil {
			t.Errorf("the manager's own patch %s refused: %v", body, err)
		}
	}
	if len(solo.Finalizers) != 0 {
		t.Errorf("Secret solo keeps finalizers %v", solo.Finalizers)
	}
	for what, body := range map[string]string{
		"change the data":            changeData(-1),
		"add data by stringData":     `{"stringData":{"other":"x"}}`,
		"change a label":             `{"metadata":{"labels":{"app":"other"}}}`,
		"add an annotation":          `{"metadata":{"annotations":{"a":"b"}}}`,
		"remove another's finalizer": `{"metadata":{"finalizers":[]}}`,
		"add another finalizer":      `{"metadata":{"finalizers":["example.com/keep","example.com/other"]}}`,
		"make it immutable":          `{"immutable":true}`,
		"add an owner":               `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"x","uid":"00000000-0000-0000-0000-000000000001"}]}}`,
	} {
		if err := patch(mgr, body); !denied(err) {
			t.Errorf("the manager could %s: %v", what, err)
		}
	}
	got := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(secret), got); err != nil {
		t.Fatal(err)
	}
	if string(got.Data["dsn"]) != "postgres://a" || len(got.Data) != 1 || got.Labels["app"] != "memory" || len(got.Annotations) != 0 {
		t.Errorf("the Secret changed: data keys %d, labels %v, annotations %v", len(got.Data), got.Labels, got.Annotations)
	}
	// The policy binds the manager only.
	if err := patch(c, `{"metadata":{"labels":{"app":"other"}}}`); err != nil {
		t.Errorf("an administrator may not change a label: %v", err)
	}
}

// config/rbac's copy of the policy (for kustomize installs) checks what the
// chart's does.
func TestConfigSecretPolicyIsTheCharts(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", "secret_finalizer_policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	byKind := func(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
		out := map[string]*unstructured.Unstructured{}
		for _, o := range objs {
			out[o.GetKind()] = o
		}
		return out
	}
	chart, config := byKind(render(t)), byKind(decode(t, string(raw)))
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if chart[kind] == nil || config[kind] == nil {
			t.Fatalf("%s: in the chart %t, in config/rbac %t", kind, chart[kind] != nil, config[kind] != nil)
		}
	}
	want, got := chart["ValidatingAdmissionPolicy"].Object["spec"].(map[string]any), config["ValidatingAdmissionPolicy"].Object["spec"].(map[string]any)
	for _, field := range []string{"failurePolicy", "matchConstraints", "variables", "validations"} {
		if !reflect.DeepEqual(want[field], got[field]) {
			t.Errorf("spec.%s differs:\nchart:  %v\nconfig: %v", field, want[field], got[field])
		}
	}
	// The service account config/default makes.
	conds, _, _ := unstructured.NestedSlice(got, "matchConditions")
	if len(conds) != 1 || !strings.Contains(conds[0].(map[string]any)["expression"].(string), `"system:serviceaccount:lethe-system:lethe-controller-manager"`) {
		t.Errorf("config/rbac's policy matches %v, want config/default's service account", conds)
	}
}

// config/default, built by kustomize as a user would, binds the policy to
// the service account it makes: a binding whose policyName kustomize did
// not prefix, or a username that is not the service account's, would leave
// the manager's patch on Secrets unchecked.
func TestConfigDefaultBindsTheSecretPolicyToTheManager(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		kubectl = filepath.Join(testenv.KubeAssets(), "kubectl")
		if _, err := os.Stat(kubectl); err != nil {
			t.Fatalf("kubectl (for its kustomize) is not installed: install Debian's kubectl, or run `make envtest-assets` with one on PATH")
		}
	}
	out, err := exec.Command(kubectl, "kustomize", filepath.Join(root, "config", "default")).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize config/default: %v\n%s", err, out)
	}
	var policy, binding, sa *unstructured.Unstructured
	for _, o := range decode(t, string(out)) {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			policy = o
		case "ValidatingAdmissionPolicyBinding":
			binding = o
		case "ServiceAccount":
			sa = o
		}
	}
	if policy == nil || binding == nil || sa == nil {
		t.Fatalf("config/default lacks the policy (%t), its binding (%t) or the service account (%t)", policy != nil, binding != nil, sa != nil)
	}
	if name, _, _ := unstructured.NestedString(binding.Object, "spec", "policyName"); name != policy.GetName() {
		t.Errorf("the binding names policy %q, the policy is %q", name, policy.GetName())
	}
	conds, _, _ := unstructured.NestedSlice(policy.Object, "spec", "matchConditions")
	want := fmt.Sprintf(`"system:serviceaccount:%s:%s"`, sa.GetNamespace(), sa.GetName())
	if len(conds) != 1 || !strings.Contains(conds[0].(map[string]any)["expression"].(string), want) {
		t.Errorf("the policy matches %v, want the service account %s", conds, want)
	}
}
