package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

// gitopsOwner is the field manager the test applies with, as Argo CD or
// Flux would with theirs; no other manager may come to own a spec field.
const gitopsOwner = "gitops-test"

// TestFinalizerPatchLeavesTheSpecAsWritten creates a request from YAML as a
// GitOps tool would, with gracePeriod "168h", and checks that once Lethe
// added its finalizer and worked on it the spec is still exactly what the
// server stored at creation (no "168h0m0s"), that Lethe's writes own no spec
// field, that kubectl get shows Ready and Status, and that Reconciling says
// the request waits for its grace period. Deleting it then removes the
// finalizer by the same patch.
func TestFinalizerPatchLeavesTheSpecAsWritten(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "gitops")
	manifest := fmt.Sprintf(`apiVersion: erasure.lethe.dev/v1alpha1
kind: ErasureRequest
metadata:
  name: from-git
  namespace: %s
spec:
  storeRef:
    name: %s
  sessionIDs:
  - %s
  gracePeriod: 168h
`, e.ns, e.store.Name, erasedA)
	sent := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(manifest), &sent.Object); err != nil {
		t.Fatal(err)
	}
	sentSpec := sent.Object["spec"].(map[string]any)
	created := sent.DeepCopy()
	if err := k8s.Create(ctx, created, client.FieldOwner(gitopsOwner)); err != nil {
		t.Fatal(err)
	}
	// The server's own defaults (immediate, dryRun, cancel) are part of the
	// live spec from the start; everything sent is there unchanged.
	createdSpec := created.Object["spec"].(map[string]any)
	for k, v := range sentSpec {
		if !reflect.DeepEqual(createdSpec[k], v) {
			t.Fatalf("spec.%s stored as %v, sent %v", k, createdSpec[k], v)
		}
	}

	// Wait until Lethe has added its finalizer and reached the grace period.
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(sent.GroupVersionKind())
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(created), live); err != nil {
			return err
		}
		if !slices.Contains(live.GetFinalizers(), controllers.Finalizer) {
			return fmt.Errorf("finalizers %v", live.GetFinalizers())
		}
		reason, _, _ := unstructured.NestedString(conditionOf(live, lethev1.ConditionGracePeriodElapsed), "reason")
		if reason != lethev1.ReasonWaitingForGrace {
			return fmt.Errorf("GracePeriodElapsed reason %q, want %s", reason, lethev1.ReasonWaitingForGrace)
		}
		return nil
	})
	liveSpec := live.Object["spec"].(map[string]any)
	if !reflect.DeepEqual(liveSpec, createdSpec) {
		a, _ := json.Marshal(createdSpec)
		b, _ := json.Marshal(liveSpec)
		t.Errorf("Lethe rewrote the spec:\ncreated %s\nnow     %s", a, b)
	}
	if g, _, _ := unstructured.NestedString(live.Object, "spec", "gracePeriod"); g != "168h" {
		t.Errorf("spec.gracePeriod is %q, want %q as written", g, "168h")
	}
	if live.GetGeneration() != created.GetGeneration() {
		t.Errorf("generation %d, was %d at creation: the spec was written", live.GetGeneration(), created.GetGeneration())
	}
	// Field ownership: only the GitOps tool owns spec fields; Lethe's
	// managers own the finalizer and the status, nothing else.
	for _, mf := range live.GetManagedFields() {
		if mf.Manager == gitopsOwner || mf.FieldsV1 == nil {
			continue
		}
		if strings.Contains(mf.FieldsV1.GetRawString(), `"f:spec"`) {
			t.Errorf("manager %q (%s, subresource %q) owns spec fields: %s", mf.Manager, mf.Operation, mf.Subresource, mf.FieldsV1.GetRawString())
		}
	}

	// kstatus (Flux) reads Reconciling: True while the grace period runs.
	rec := conditionOf(live, lethev1.ConditionReconciling)
	if rec["status"] != "True" || rec["reason"] != lethev1.ReasonWaitingForGrace {
		t.Errorf("Reconciling = %v, want True/%s", rec, lethev1.ReasonWaitingForGrace)
	}
	if st := conditionOf(live, lethev1.ConditionStalled); st["status"] != "False" {
		t.Errorf("Stalled = %v during the grace period", st)
	}

	// kubectl get: the server's Table has Ready and Status, saying what the request waits for.
	row := tableRow(t, e.ns, created.GetName())
	if row["Ready"] != "False" || !strings.HasPrefix(fmt.Sprint(row["Status"]), "waiting for step GracePeriodElapsed (WaitingForGracePeriod)") {
		t.Errorf("kubectl get row %v: want Ready False and a Status naming the grace period", row)
	}
	for _, col := range []string{"Phase", "Sessions", "Deadline", "Grace ends", "Age"} {
		if _, ok := row[col]; !ok {
			t.Errorf("kubectl get lost the %s column: %v", col, row)
		}
	}

	// Deleting the request lifts the tombstone and removes the finalizer (a patch too).
	if err := k8s.Delete(ctx, created); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(created), live)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there with finalizers %v", live.GetFinalizers())
	})
	if n := e.count(t, `SELECT count(*) FROM memory.sessions WHERE tombstoned_at IS NOT NULL`); n != 0 {
		t.Errorf("%d sessions still tombstoned after the request was deleted", n)
	}
}

// conditionOf returns the condition of type ty of an unstructured object, or nil.
func conditionOf(u *unstructured.Unstructured, ty string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == ty {
			return m
		}
	}
	return nil
}

// tableRow asks the API server for ErasureRequests as kubectl get does (a
// meta.k8s.io Table built from the CRD's printer columns) and returns the
// named row, cell by column name.
func tableRow(t *testing.T, ns, name string) map[string]any {
	t.Helper()
	hc, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	url := strings.TrimSuffix(cp.Config.Host, "/") + "/apis/erasure.lethe.dev/v1alpha1/namespaces/" + ns + "/erasurerequests"
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v: %s", url, resp.StatusCode, err, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatal(err)
	}
	for _, r := range table.Rows {
		if len(r.Cells) != len(table.ColumnDefinitions) || r.Cells[0] != name {
			continue
		}
		out := map[string]any{}
		for i, c := range table.ColumnDefinitions {
			out[c.Name] = r.Cells[i]
		}
		return out
	}
	t.Fatalf("no row %s in the Table: %s", name, body)
	return nil
}
