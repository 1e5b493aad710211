// Package argocd holds Lethe's Argo CD health checks (Lua); this test runs
// them with gopher-lua, as Argo CD does, against objects in every phase.
package argocd

import (
	"os"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// health runs script with obj set, as Argo CD's health check does.
func health(t *testing.T, script string, obj runtime.Object) (status, message string) {
	t.Helper()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	L := lua.NewState(lua.Options{SkipOpenLibs: false})
	defer L.Close()
	L.SetGlobal("obj", toLua(L, u))
	if err := L.DoString(string(src)); err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	hs, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("%s returned %s, want a table", script, L.Get(-1).Type())
	}
	return hs.RawGetString("status").String(), hs.RawGetString("message").String()
}

func toLua(L *lua.LState, v any) lua.LValue {
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
		t := L.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range x {
			t.Append(toLua(L, e))
		}
		return t
	}
	panic("unexpected type")
}

func cond(t, status, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}
}

func request(phase lethev1.Phase, gen, observed int64, conds ...metav1.Condition) *lethev1.ErasureRequest {
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: "r", Generation: gen}}
	er.Status.Phase, er.Status.ObservedGeneration, er.Status.Conditions = phase, observed, conds
	return er
}

func TestErasureRequestHealthInEveryPhase(t *testing.T) {
	graceEnds := metav1.NewTime(metav1.Now().Add(1))
	waiting := request(lethev1.PhaseTombstoned, 1, 1, cond("GracePeriodElapsed", "False", "WaitingForGracePeriod", "waiting"))
	waiting.Status.GraceEndsAt = &graceEnds
	cases := map[string]struct {
		obj    *lethev1.ErasureRequest
		status string
	}{
		"no status yet":       {&lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Generation: 1}}, "Progressing"},
		"Pending":             {request(lethev1.PhasePending, 1, 1), "Progressing"},
		"spec not yet seen":   {request(lethev1.PhaseBackupsRotated, 2, 1), "Progressing"},
		"Planned":             {request(lethev1.PhasePlanned, 1, 1, cond("Ready", "True", "DryRun", "dry run")), "Healthy"},
		"Tombstoned in grace": {waiting, "Suspended"},
		"GracePeriod, deleting": {request(lethev1.PhaseGracePeriod, 1, 1,
			cond("GracePeriodElapsed", "True", "GraceElapsed", ""), cond("Deleted", "False", "Deleting", "")), "Progressing"},
		"Deleted, pruning graph": {request(lethev1.PhaseDeleted, 1, 1, cond("GraphReconciled", "False", "GraphPruning", "")), "Progressing"},
		"GraphReconciled, backups expiring": {request(lethev1.PhaseGraphReconciled, 1, 1,
			cond("BackupsRotated", "False", "BackupsExpiring", "2 Velero Backup(s) remain")), "Suspended"},
		"BackupsRotated": {request(lethev1.PhaseBackupsRotated, 1, 1, cond("Ready", "True", "Completed", "done")), "Healthy"},
		"Cancelled":      {request(lethev1.PhaseCancelled, 1, 1), "Healthy"},
		"Failed":         {request(lethev1.PhaseFailed, 1, 1), "Degraded"},
		"Stalled on residue": {request(lethev1.PhaseTombstoned, 1, 1,
			cond("Stalled", "True", "ResidueFound", "copies remain")), "Degraded"},
	}
	for name, tc := range cases {
		status, msg := health(t, "health-erasurerequest.lua", tc.obj)
		if status != tc.status {
			t.Errorf("%s: %s (%q), want %s", name, status, msg, tc.status)
		}
		if status == "Suspended" && msg == "" {
			t.Errorf("%s: Suspended without saying until when", name)
		}
	}
	if _, msg := health(t, "health-erasurerequest.lua", waiting); msg == "" || !strings.Contains(msg, graceEnds.UTC().Format("2006-01-02")) {
		t.Errorf("the grace message does not say until when: %q", msg)
	}
}

func TestMemoryStoreHealth(t *testing.T) {
	store := func(gen, observed int64, conds ...metav1.Condition) *lethev1.MemoryStore {
		s := &lethev1.MemoryStore{ObjectMeta: metav1.ObjectMeta{Generation: gen}}
		s.Status.ObservedGeneration, s.Status.Conditions = observed, conds
		return s
	}
	for name, tc := range map[string]struct {
		obj    *lethev1.MemoryStore
		status string
	}{
		"new":       {store(1, 0), "Progressing"},
		"ready":     {store(1, 1, cond("Ready", "True", "AllReady", "ok")), "Healthy"},
		"not ready": {store(1, 1, cond("Ready", "False", "NotReady", "not ready: GraphReady")), "Degraded"},
		"stale":     {store(2, 1, cond("Ready", "True", "AllReady", "ok")), "Progressing"},
	} {
		if status, msg := health(t, "health-memorystore.lua", tc.obj); status != tc.status {
			t.Errorf("%s: %s (%q), want %s", name, status, msg, tc.status)
		}
	}
}
