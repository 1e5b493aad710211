package erasurecli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

const fullDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// inGrace is a request tombstoned and waiting out its grace period.
func inGrace() *lethev1.ErasureRequest {
	t0 := metav1.NewTime(now.Add(-time.Hour))
	return &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "forget", Namespace: "apps", UID: "u1", CreationTimestamp: t0},
		Spec:       lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"}, SessionIDs: []lethev1.SessionID{idA}, Reason: "SECRET-FREE-TEXT"},
		Status: lethev1.ErasureRequestStatus{
			Phase:       lethev1.PhaseTombstoned,
			Deadline:    timePtr(now.AddDate(0, 1, 0)),
			GraceEndsAt: timePtr(now.Add(167 * time.Hour)),
			Conditions: []metav1.Condition{
				{Type: lethev1.ConditionTombstoned, Status: metav1.ConditionTrue, Reason: lethev1.ReasonSessionsTombstoned, Message: "1 session(s) tombstoned", LastTransitionTime: t0},
				{Type: lethev1.ConditionGracePeriodElapsed, Status: metav1.ConditionFalse, Reason: lethev1.ReasonWaitingForGrace, Message: "the grace period has not ended", LastTransitionTime: t0},
				{Type: lethev1.ConditionStalled, Status: metav1.ConditionFalse, Reason: lethev1.ReasonNoActionNeeded, LastTransitionTime: t0},
			},
			Plan: &lethev1.ErasurePlan{SessionsFound: 1, Rows: []lethev1.TableCount{{Table: "memory.rounds", Rows: 3}, {Table: "memory.sessions", Rows: 1}}, Embeddings: 2},
			Evidence: &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{{Step: lethev1.ConditionTombstoned, StartedAt: &t0, CompletedAt: &t0,
				Counts: []lethev1.TableCount{{Table: "memory.sessions", Rows: 1}}, Verification: []lethev1.Verification{{Check: "x", Found: 0}}}}},
			History: []lethev1.HistoryEntry{{Phase: lethev1.PhaseTombstoned, Time: t0, EvidenceDigest: fullDigest, Digest: fullDigest}},
		},
	}
}

func TestNextWaitNamesTheConditionAndUntilWhen(t *testing.T) {
	w := nextWait(inGrace())
	if w == nil || w.Condition != lethev1.ConditionGracePeriodElapsed || w.Status != metav1.ConditionFalse ||
		w.Reason != lethev1.ReasonWaitingForGrace || w.Until == nil || !w.Until.Equal(timePtr(now.Add(167*time.Hour))) || w.Human {
		t.Fatalf("got %+v", w)
	}
	line := progress(inGrace(), now)
	for _, want := range []string{"phase Tombstoned", "waiting for GracePeriodElapsed (WaitingForGracePeriod)", "until 2026-11-27T11:00:00Z", "in 6d23h"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress lacks %q: %s", want, line)
		}
	}

	fresh := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: "new"}}
	if w := nextWait(fresh); w == nil || w.Condition != lethev1.ConditionTombstoned || !strings.Contains(w.Message, "not picked the request up") {
		t.Fatalf("a request without status: %+v", w)
	}

	stalled := inGrace()
	stalled.Status.Conditions[2] = metav1.Condition{Type: lethev1.ConditionStalled, Status: metav1.ConditionTrue, Reason: lethev1.ReasonResidueFound, Message: "Deleted: residue found"}
	if w := nextWait(stalled); w == nil || !w.Human || w.Reason != lethev1.ReasonResidueFound {
		t.Fatalf("stalled: %+v", w)
	}
	if err := outcome(stalled); err == nil || !strings.Contains(err.Error(), "a human must act") {
		t.Fatalf("stalled outcome: %v", err)
	}

	rotating := inGrace()
	exp1, exp2 := timePtr(now.Add(48*time.Hour)), timePtr(now.Add(72*time.Hour))
	rotating.Status.Conditions = []metav1.Condition{
		{Type: lethev1.ConditionTombstoned, Status: metav1.ConditionTrue}, {Type: lethev1.ConditionGracePeriodElapsed, Status: metav1.ConditionTrue},
		{Type: lethev1.ConditionDeleted, Status: metav1.ConditionTrue}, {Type: lethev1.ConditionGraphReconciled, Status: metav1.ConditionTrue},
		{Type: lethev1.ConditionBackupsRotated, Status: metav1.ConditionFalse, Reason: lethev1.ReasonBackupsExpiring}}
	rotating.Status.Evidence.Steps = append(rotating.Status.Evidence.Steps, lethev1.StepEvidence{Step: lethev1.ConditionBackupsRotated,
		Backups: []lethev1.BackupEvidence{{Name: "a", Expiration: exp1}, {Name: "b", Expiration: exp2}, {Name: "c", Expiration: timePtr(now.Add(99 * time.Hour)), GoneAt: exp1}}})
	if w := nextWait(rotating); w == nil || w.Condition != lethev1.ConditionBackupsRotated || w.Until == nil || !w.Until.Equal(exp2) {
		t.Fatalf("rotating backups: %+v", w)
	}

	for _, p := range []lethev1.Phase{lethev1.PhaseBackupsRotated, lethev1.PhaseCancelled, lethev1.PhasePlanned} {
		er := inGrace()
		er.Status.Phase = p
		if w := nextWait(er); w != nil {
			t.Errorf("%s waits for %+v", p, w)
		}
		wantOK := p == lethev1.PhaseBackupsRotated || p == lethev1.PhasePlanned
		if err := outcome(er); (err == nil) != wantOK {
			t.Errorf("%s: outcome %v", p, err)
		}
	}
}

func TestDescribe(t *testing.T) {
	events := []eventsv1.Event{
		{Type: "Normal", Reason: "Tombstoned", Note: "1 session(s) tombstoned", ReportingController: "lethe-erasurerequest", EventTime: metav1.NewMicroTime(now.Add(-time.Hour))},
		{Type: "Normal", Reason: "ReceiptSigned", Note: "older", ReportingController: "lethe-erasurerequest", EventTime: metav1.NewMicroTime(now.Add(-2 * time.Hour))},
	}
	var out bytes.Buffer
	describe(&out, inGrace(), events, nil, false, now)
	s := out.String()
	for _, want := range []string{
		"Phase:", "Tombstoned", "Waiting for:", "GracePeriodElapsed (status False, reason WaitingForGracePeriod) until 2026-11-27T11:00:00Z",
		"the grace period has not ended", "Conditions:", "WaitingForGracePeriod", "Plan:", "4 row(s) in 2 table(s)",
		"Evidence:", "1/1 absent", "History:", "hash chain", "Events:", "lethe-erasurerequest", "Deadline:", "grace period 168h (default)",
		fullDigest[:19] + "…",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("status lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "SECRET-FREE-TEXT") {
		t.Errorf("status prints the free-text reason:\n%s", s)
	}
	if strings.Contains(s, fullDigest) {
		t.Errorf("the default status prints a full digest:\n%s", s)
	}
	if strings.Index(s, "older") > strings.LastIndex(s, "1 session(s) tombstoned") {
		t.Errorf("events not oldest first:\n%s", s)
	}
	out.Reset()
	describe(&out, inGrace(), nil, nil, true, now)
	if !strings.Contains(out.String(), fullDigest) {
		t.Errorf("the wide status lacks the full digest:\n%s", out.String())
	}
}

func TestOutputFormats(t *testing.T) {
	er := inGrace()
	for format, check := range map[string]func([]byte) error{
		"json": func(b []byte) error { return json.Unmarshal(b, &lethev1.ErasureRequest{}) },
		"yaml": func(b []byte) error { return yaml.UnmarshalStrict(b, &lethev1.ErasureRequest{}) },
	} {
		f := newOutputFlags()
		f.format = format
		var out bytes.Buffer
		if err := f.printObj(er.DeepCopy(), &out); err != nil {
			t.Fatal(err)
		}
		if err := check(out.Bytes()); err != nil {
			t.Fatalf("-o %s does not parse: %v\n%s", format, err, out.String())
		}
		if !strings.Contains(out.String(), "erasure.lethe.dev/v1alpha1") || !strings.Contains(out.String(), fullDigest) {
			t.Fatalf("-o %s lacks apiVersion or the full digest:\n%s", format, out.String())
		}
	}
	f := newOutputFlags()
	f.format = "name"
	var out bytes.Buffer
	if err := f.printObj(er.DeepCopy(), &out); err != nil || out.String() != "erasurerequest.erasure.lethe.dev/forget\n" {
		t.Fatalf("-o name: %v %q", err, out.String())
	}
	f.format = "xml"
	if err := f.validate(); err == nil || !strings.Contains(err.Error(), "allowed formats") {
		t.Fatalf("-o xml: %v", err)
	}

	out.Reset()
	if err := printTable(&out, requestTable(now, false, er), false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NAME", "WAITING FOR", "forget", "GracePeriodElapsed (WaitingForGracePeriod)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "HISTORY HEAD") {
		t.Errorf("a wide column in the default table:\n%s", out.String())
	}
	out.Reset()
	_ = printTable(&out, requestTable(now, true, er), true)
	if !strings.Contains(out.String(), "HISTORY HEAD") || !strings.Contains(out.String(), fullDigest) {
		t.Errorf("wide table lacks the full digest:\n%s", out.String())
	}

	out.Reset()
	if err := printHistory(&out, er, false); err != nil || strings.Contains(out.String(), fullDigest) || !strings.Contains(out.String(), fullDigest[:19]+"…") {
		t.Errorf("history, short digests: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := printHistory(&out, er, true); err != nil || !strings.Contains(out.String(), fullDigest) || !strings.Contains(out.String(), "PREVIOUS") {
		t.Errorf("history, wide: %v\n%s", err, out.String())
	}
}

func TestPlanningRequestIsMarkedAndExpires(t *testing.T) {
	er, err := (&specFlags{store: "m", ids: []string{idA}}).request(strings.Repeat("a", 253), "ns", nil, now)
	if err != nil {
		t.Fatal(err)
	}
	pr := planningRequest(er, now.Add(time.Minute))
	if len(pr.Name) > 253 || !strings.Contains(pr.Name, "-plan-") || !pr.Spec.DryRun || pr.Labels[planLabel] != "true" || pr.Labels[managedByLabel] != managedBy {
		t.Fatalf("planning request: %q %v dryRun=%v", pr.Name, pr.Labels, pr.Spec.DryRun)
	}
	if er.Spec.DryRun || er.Labels != nil {
		t.Fatal("planningRequest changed its input")
	}
	if planExpired(pr, now) || !planExpired(pr, now.Add(2*time.Minute)) {
		t.Fatal("expiry not honoured")
	}
	real := pr.DeepCopy()
	real.Spec.DryRun = false
	if planExpired(real, now.Add(time.Hour)) {
		t.Fatal("a real request would be removed as an expired plan")
	}
}

func TestCompletionScripts(t *testing.T) {
	out, _, err := runCLI(t, "completion", "kubectl")
	if err != nil || !strings.Contains(out, `exec kubectl-erasure __complete "$@"`) {
		t.Fatalf("kubectl helper: %v\n%s", err, out)
	}
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		if out, _, err := runCLI(t, "completion", sh); err != nil || !strings.Contains(out, "kubectl-erasure") {
			t.Errorf("%s: %v (%d bytes)", sh, err, len(out))
		}
	}
	// Subcommands and flags complete without a cluster.
	out, _, err = runCLI(t, "__complete", "sta")
	if err != nil || !strings.Contains(out, "status") {
		t.Fatalf("__complete sta: %v\n%s", err, out)
	}
	out, _, _ = runCLI(t, "__complete", "status", "-o", "")
	if !strings.Contains(out, "wide") || !strings.Contains(out, "yaml") {
		t.Fatalf("-o completion:\n%s", out)
	}
}

func TestVersionClientOnly(t *testing.T) {
	out, _, err := runCLI(t, "version", "--client", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got versionInfo
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Client.GoVersion == "" || got.Server != nil {
		t.Fatalf("%v %+v\n%s", err, got, out)
	}
	// Without a readable cluster the server's versions are unknown, not an error.
	out, _, err = runCLI(t, "version", "-o", "yaml")
	if err != nil || !strings.Contains(out, "kubernetes: unknown") || !strings.Contains(out, "lethe: unknown") {
		t.Fatalf("%v\n%s", err, out)
	}
}
