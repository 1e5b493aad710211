package controllers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasurecli"
)

// kubeconfig writes a kubeconfig for the test API server.
func kubeconfig(t *testing.T) string {
	t.Helper()
	return kubeconfigFor(t, cp.Config)
}

// kubectlErasure runs the plugin in-process, as `kubectl erasure ARGS -n NS`;
// it returns standard output and error together.
func kubectlErasure(t *testing.T, ns string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut, err := kubectlErasureCtx(ctx, t, ns, args...)
	return out + errOut, err
}

// kubectlErasureCtx is kubectlErasure on the caller's context, with the
// two streams apart (so that -o yaml can be parsed).
func kubectlErasureCtx(ctx context.Context, t *testing.T, ns string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := erasurecli.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfig(t), "-n", ns))
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// noRequestsLeft waits until the namespace holds no ErasureRequest.
func noRequestsLeft(t *testing.T, ns string) {
	t.Helper()
	eventually(t, 20*time.Second, func() error {
		list := &lethev1.ErasureRequestList{}
		if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			er := list.Items[0]
			return fmt.Errorf("%d ErasureRequest(s) left in the namespace, e.g. %s (deleted at %v, finalizers %v, conditions %s)",
				len(list.Items), er.Name, er.DeletionTimestamp, er.Finalizers, conditionsString(er.Status.Conditions))
		}
		return nil
	})
}

func TestPluginPlanShowsThePlanAndCreatesNothing(t *testing.T) {
	e := newMemoryEnv(t, "plugin-plan")
	before := e.dump(t)
	out, err := kubectlErasure(t, e.ns, "plan", "preview", "--store", e.store.Name, "--session-id", erasedA, "--session-id", otherT2)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"sessions found: 1", "not found (never touched): 1", otherT2, "memory.rounds", "nothing was tombstoned"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	noRequestsLeft(t, e.ns)

	// -o yaml prints the planned request, plan included.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stdout, stderr, err := kubectlErasureCtx(ctx, t, e.ns, "plan", "--store", e.store.Name, "--session-id", erasedA, "-o", "yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	planned := &lethev1.ErasureRequest{}
	if err := yaml.Unmarshal([]byte(stdout), planned); err != nil || planned.Status.Phase != lethev1.PhasePlanned ||
		planned.Status.Plan == nil || planned.Status.Plan.SessionsFound != 1 {
		t.Fatalf("plan -o yaml: %v\n%s", err, stdout)
	}
	noRequestsLeft(t, e.ns)
	if after := e.dump(t); !maps.Equal(before, after) {
		t.Fatal("the plan changed the database")
	}

	// Bad input fails before anything reaches the cluster, naming each problem.
	out, err = kubectlErasure(t, e.ns, "plan", "bad", "--store", e.store.Name, "--session-id", "NOT-A-UUID", "--immediate")
	if err == nil || !strings.Contains(err.Error(), `"NOT-A-UUID" is not a lowercase canonical UUID`) || !strings.Contains(err.Error(), "--immediate needs --reason") {
		t.Fatalf("bad input: %v\n%s", err, out)
	}
	// kubectl's --dry-run means something else: the old flag points at plan.
	out, err = kubectlErasure(t, e.ns, "create", "preview", "--store", e.store.Name, "--session-id", erasedA, "--dry-run")
	if err == nil || !strings.Contains(err.Error(), "kubectl erasure plan") {
		t.Fatalf("create --dry-run: %v\n%s", err, out)
	}
	noRequestsLeft(t, e.ns)
}

// storeThatNeverPlans is a namespace whose MemoryStore's database Secret
// does not exist: a request there waits (DatabaseUnavailable) without
// stalling, so a plan is still waiting when it is interrupted.
func storeThatNeverPlans(t *testing.T, prefix string) string {
	t.Helper()
	ns := newNamespace(t, prefix)
	store := newStore(ns, nil)
	if err := k8s.Create(context.Background(), store); err != nil {
		t.Fatal(err)
	}
	// It would otherwise be retried for the rest of the suite.
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), store) })
	return ns
}

// planningRequestAppears waits until the plugin's planning request exists
// (one not named in others).
func planningRequestAppears(t *testing.T, ns string, others ...string) string {
	t.Helper()
	var name string
	eventually(t, 30*time.Second, func() error {
		list := &lethev1.ErasureRequestList{}
		if err := k8s.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{"erasure.lethe.dev/plan": "true"}); err != nil {
			return err
		}
		for _, er := range list.Items {
			if er.Spec.DryRun && er.Annotations["erasure.lethe.dev/plan-expires-at"] != "" && !slices.Contains(others, er.Name) {
				name = er.Name
				return nil
			}
		}
		return errors.New("no planning request yet")
	})
	return name
}

func TestPluginPlanLeavesNothingBehindWhenInterrupted(t *testing.T) {
	ns := storeThatNeverPlans(t, "plugin-plan-cancel")
	// A planning request a killed plugin left behind, expired: the next plan removes it.
	leftover := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: "old-plan-x1y2z", Namespace: ns,
		Labels:      map[string]string{"erasure.lethe.dev/plan": "true"},
		Annotations: map[string]string{"erasure.lethe.dev/plan-expires-at": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)}},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"}, SessionIDs: []lethev1.SessionID{erasedA}, DryRun: true}}
	if err := k8s.Create(context.Background(), leftover); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var stderr string
	go func() {
		var err error
		_, stderr, err = kubectlErasureCtx(ctx, t, ns, "plan", "preview", "--store", "memory", "--session-id", erasedA, "--timeout", "2m")
		done <- err
	}()
	planningRequestAppears(t, ns, leftover.Name)
	cancel() // what Ctrl-C does to the command's context
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("an interrupted plan returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the plan did not return after its context was cancelled")
	}
	if strings.Contains(stderr, "could not remove") {
		t.Fatalf("clean-up failed:\n%s", stderr)
	}
	noRequestsLeft(t, ns)
}

func TestPluginPlanCleansUpOnSIGINT(t *testing.T) {
	ns := storeThatNeverPlans(t, "plugin-plan-sigint")
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go toolchain is needed to build the plugin for this test: ", err)
	}
	bin := filepath.Join(t.TempDir(), "kubectl-erasure")
	build := exec.Command(gobin, "build", "-o", bin, "../cmd/kubectl-erasure")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "plan", "--store", "memory", "--session-id", erasedA, "--timeout", "2m", "--kubeconfig", kubeconfig(t), "-n", ns)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	planningRequestAppears(t, ns)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("the interrupted plugin exited with %v\n%s", err, stderr.String())
		}
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("the plugin was killed by the signal instead of handling it\n%s", stderr.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the plugin did not exit after SIGINT")
	}
	if !strings.Contains(stderr.String(), "interrupt signal received") {
		t.Errorf("stderr does not say the plan was interrupted:\n%s", stderr.String())
	}
	noRequestsLeft(t, ns)
}

func TestPluginExportAppliesAndRoundTrips(t *testing.T) {
	e := newMemoryEnv(t, "plugin-export")
	requested := time.Now().Add(-72 * time.Hour).UTC().Truncate(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stdout, stderr, err := kubectlErasureCtx(ctx, t, e.ns, "create", "from-git", "--store", e.store.Name, "--session-id", keptB,
		"--grace", "72h", "--requested-at", requested.Format(time.RFC3339), "--export")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	// Nothing was created: the manifest is for Git.
	noRequestsLeft(t, e.ns)
	for _, unwanted := range []string{"status:", "creationTimestamp", "resourceVersion", "uid:", "managedFields"} {
		if strings.Contains(stdout, unwanted) {
			t.Errorf("the exported manifest has %q:\n%s", unwanted, stdout)
		}
	}
	exported := &lethev1.ErasureRequest{}
	if err := yaml.UnmarshalStrict([]byte(stdout), exported); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if exported.APIVersion != lethev1.GroupVersion.String() || exported.Kind != "ErasureRequest" || exported.Namespace != e.ns {
		t.Fatalf("exported type or namespace: %+v %q", exported.TypeMeta, exported.Namespace)
	}
	// It applies cleanly, as a GitOps tool would apply it...
	applied := exported.DeepCopy()
	if err := k8s.Create(context.Background(), applied); err != nil {
		t.Fatalf("the exported manifest does not apply: %v\n%s", err, stdout)
	}
	// ...and the server keeps the spec exactly as exported.
	stored := &lethev1.ErasureRequest{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(applied), stored); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(stored.Spec, exported.Spec) {
		t.Fatalf("round trip changed the spec:\nexported %+v\nstored   %+v", exported.Spec, stored.Spec)
	}
	// The legal deadline runs from when the subject asked, not from the filing.
	waitPhase(t, stored, lethev1.PhaseTombstoned)
	if d := stored.Status.Deadline; d == nil || !d.Time.Equal(requested.AddDate(0, 1, 0)) {
		t.Fatalf("deadline %v, want a month after %v", d, requested)
	}

	// The same validation as create: nothing printed on bad input.
	stdout, _, err = kubectlErasureCtx(ctx, t, e.ns, "create", "bad", "--store", e.store.Name, "--session-id", keptB, "--session-id", keptB, "--export")
	if err == nil || stdout != "" || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("export of a duplicate: %v\n%s", err, stdout)
	}
}

func TestPluginCreateWaitFollowsTheRequestToTheEnd(t *testing.T) {
	e := newMemoryEnv(t, "plugin-wait")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stdout, stderr, err := kubectlErasureCtx(ctx, t, e.ns, "create", "forget", "--store", e.store.Name, "--session-id", erasedA,
		"--immediate", "--reason", "DPO-9", "--wait", "--timeout", "90s", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	done := &lethev1.ErasureRequest{}
	if err := json.Unmarshal([]byte(stdout), done); err != nil || done.Status.Phase != lethev1.PhaseBackupsRotated {
		t.Fatalf("--wait -o json: %v, phase %q\n%s", err, done.Status.Phase, stdout)
	}
	if !strings.Contains(stderr, "forget: phase") || !strings.Contains(stderr, "phase BackupsRotated") {
		t.Errorf("no progress lines:\n%s", stderr)
	}
	if n := e.sessionRows(t, erasedA); n != 0 {
		t.Fatalf("%d rows of the erased session remain", n)
	}

	// history: short digests by default, full ones on request.
	head := done.Status.History[len(done.Status.History)-1].Digest
	out, err := kubectlErasure(t, e.ns, "history", "forget")
	if err != nil || strings.Contains(out, head) || !strings.Contains(out, head[:19]) {
		t.Fatalf("history: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"history", "forget", "--wide"}, {"history", "forget", "-o", "wide"}, {"status", "forget", "--wide"}} {
		if out, err := kubectlErasure(t, e.ns, args...); err != nil || !strings.Contains(out, head) {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	stdout, _, err = kubectlErasureCtx(ctx, t, e.ns, "history", "forget", "-o", "yaml")
	got := &lethev1.ErasureRequest{}
	if err != nil || yaml.Unmarshal([]byte(stdout), got) != nil || len(got.Status.History) != len(done.Status.History) {
		t.Fatalf("history -o yaml: %v\n%s", err, stdout)
	}
	stdout, _, err = kubectlErasureCtx(ctx, t, e.ns, "status", "forget", "-o", "name")
	if err != nil || stdout != "erasurerequest.erasure.lethe.dev/forget\n" {
		t.Fatalf("status -o name: %v %q", err, stdout)
	}

	// A request in its grace period does not finish within the timeout: exit 2, saying what it waits for.
	_, stderr, err = kubectlErasureCtx(ctx, t, e.ns, "create", "slow", "--store", e.store.Name, "--session-id", keptB, "--wait", "--timeout", "5s")
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: "slow", Namespace: e.ns}})
	})
	var exit *erasurecli.ExitError
	if !errors.As(err, &exit) || exit.Code != 2 || !strings.Contains(err.Error(), "GracePeriodElapsed") {
		t.Fatalf("--wait on a request in its grace period: %v\n%s", err, stderr)
	}
}

func TestPluginStatusSaysWhatTheRequestWaitsFor(t *testing.T) {
	e := newMemoryEnv(t, "plugin-status")
	if out, err := kubectlErasure(t, e.ns, "create", "waiting", "--store", e.store.Name, "--session-id", keptB); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	er := &lethev1.ErasureRequest{}
	er.Namespace, er.Name = e.ns, "waiting"
	waitPhase(t, er, lethev1.PhaseTombstoned)
	var out string
	// The event is written asynchronously: wait for it too.
	eventually(t, 20*time.Second, func() error {
		var err error
		out, err = kubectlErasure(t, e.ns, "status", "waiting")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "Normal") || !strings.Contains(out, "lethe-erasurerequest") {
			return errors.New("no event yet")
		}
		return nil
	})
	for _, want := range []string{
		"Phase:", "Tombstoned",
		"Waiting for:", "GracePeriodElapsed (status False, reason " + lethev1.ReasonWaitingForGrace + ") until " + er.Status.GraceEndsAt.UTC().Format(time.RFC3339),
		"Conditions:", "Plan:", "sessions found 1 of 1", "Evidence:", "History:", "hash chain verifies", "Events:",
		"Deadline:", "grace period 168h",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stdout, _, err := kubectlErasureCtx(ctx, t, e.ns, "status", "waiting", "-o", "json")
	got := &lethev1.ErasureRequest{}
	if err != nil || json.Unmarshal([]byte(stdout), got) != nil || got.Status.Phase != lethev1.PhaseTombstoned {
		t.Fatalf("status -o json: %v\n%s", err, stdout)
	}
	// cancel prints the request too.
	stdout, _, err = kubectlErasureCtx(ctx, t, e.ns, "cancel", "waiting", "-o", "yaml")
	if err != nil || yaml.Unmarshal([]byte(stdout), got) != nil || !got.Spec.Cancel {
		t.Fatalf("cancel -o yaml: %v\n%s", err, stdout)
	}
	waitPhase(t, er, lethev1.PhaseCancelled)
}

func TestPluginVersionReportsClientAndServer(t *testing.T) {
	ns := newNamespace(t, "plugin-version")
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	sv, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	out, err := kubectlErasure(t, ns, "version")
	if err != nil || !strings.Contains(out, "Client: kubectl-erasure") || !strings.Contains(out, "Server: Kubernetes "+sv.GitVersion) {
		t.Fatalf("version: %v\n%s", err, out)
	}
	// The manager's version comes from its Deployment's label, once there is one.
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "lethe", Namespace: ns, Labels: map[string]string{"app.kubernetes.io/name": "lethe", "app.kubernetes.io/version": "9.8.7-test"}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "lethe-version-test"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "lethe-version-test"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "example.invalid/lethe:9.8.7-test"}}}},
		},
	}
	if err := k8s.Create(context.Background(), dep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), dep) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stdout, _, err := kubectlErasureCtx(ctx, t, ns, "version", "-o", "json")
	var got struct {
		Client struct {
			Version   string `json:"version"`
			GoVersion string `json:"goVersion"`
		} `json:"clientVersion"`
		Server struct {
			Kubernetes string `json:"kubernetes"`
			Lethe      string `json:"lethe"`
		} `json:"serverVersion"`
	}
	if err != nil || json.Unmarshal([]byte(stdout), &got) != nil {
		t.Fatalf("version -o json: %v\n%s", err, stdout)
	}
	if got.Client.Version == "" || got.Client.GoVersion == "" || got.Server.Kubernetes != sv.GitVersion || !strings.Contains(got.Server.Lethe, "9.8.7-test") {
		t.Fatalf("version -o json: %+v", got)
	}
}

func TestPluginCompletesRequestAndStoreNames(t *testing.T) {
	ns := storeThatNeverPlans(t, "plugin-complete")
	for _, name := range []string{"forget-ticket-1", "forget-ticket-2"} {
		er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"}, SessionIDs: []lethev1.SessionID{keptB}, DryRun: true}}
		if err := k8s.Create(context.Background(), er); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), er) })
	}
	complete := func(words ...string) []string {
		t.Helper()
		var out bytes.Buffer
		cmd := erasurecli.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &bytes.Buffer{}})
		// As kubectl_complete-erasure calls it: the words typed, the last one being completed.
		cmd.SetArgs(append([]string{"__complete", "--kubeconfig", kubeconfig(t), "-n", ns}, words...))
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		var names []string
		for line := range strings.SplitSeq(out.String(), "\n") {
			if line != "" && !strings.HasPrefix(line, ":") {
				names = append(names, strings.SplitN(line, "\t", 2)[0])
			}
		}
		return names
	}
	for _, sub := range []string{"status", "history", "cancel", "verify", "receipt"} {
		if got := complete(sub, ""); !slices.Equal(got, []string{"forget-ticket-1", "forget-ticket-2"}) {
			t.Errorf("%s completes %v", sub, got)
		}
	}
	if got := complete("create", "x", "--store", ""); !slices.Equal(got, []string{"memory"}) {
		t.Errorf("--store completes %v", got)
	}
	// The helper kubectl runs for `kubectl erasure <TAB>`.
	out, err := kubectlErasure(t, ns, "completion", "kubectl")
	if err != nil || !strings.Contains(out, `kubectl-erasure __complete "$@"`) {
		t.Fatalf("completion kubectl: %v\n%s", err, out)
	}
}

func TestPluginCreatesHistoryVerifiesAndCatchesAnAlteredReceipt(t *testing.T) {
	e := newMemoryEnv(t, "plugin-audit")
	out, err := kubectlErasure(t, e.ns, "create", "forget", "--store", e.store.Name, "--session-id", erasedA, "--immediate", "--reason", "DPO-7")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	er := &lethev1.ErasureRequest{}
	er.Namespace, er.Name = e.ns, "forget"
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	assertSignedReceipt(t, er)

	out, err = kubectlErasure(t, e.ns, "history", "forget")
	if err != nil || !strings.Contains(out, "Tombstoned") || !strings.Contains(out, "BackupsRotated") || !strings.Contains(out, "signed with key") {
		t.Fatalf("history: %v\n%s", err, out)
	}
	out, err = kubectlErasure(t, e.ns, "verify", "forget")
	if err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("verify of an untouched request: %v\n%s", err, out)
	}
	out, err = kubectlErasure(t, e.ns, "receipt", "forget")
	if err != nil || !strings.Contains(out, `"payloadType": "application/vnd.in-toto+json"`) {
		t.Fatalf("receipt: %v\n%s", err, out)
	}

	// The API server refuses an edited history entry (S5)...
	edited := er.DeepCopy()
	edited.Status.History[1].Phase = lethev1.PhaseCancelled
	if err := k8s.Status().Update(context.Background(), edited); err == nil {
		t.Fatal("the API server accepted an edited history entry")
	}
	// ...and what it lets through (the receipt) is caught by verify.
	altered := er.DeepCopy()
	altered.Status.Receipt.Digest = altered.Status.History[0].Digest
	if err := k8s.Status().Update(context.Background(), altered); err != nil {
		t.Fatal(err)
	}
	out, err = kubectlErasure(t, e.ns, "verify", "forget")
	var exit *erasurecli.ExitError
	if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), "does NOT verify") {
		t.Fatalf("verify of an altered receipt: %v\n%s", err, out)
	}
}

func TestPluginCancelsDuringTheGracePeriod(t *testing.T) {
	e := newMemoryEnv(t, "plugin-cancel")
	if out, err := kubectlErasure(t, e.ns, "create", "oops", "--store", e.store.Name, "--session-id", keptB); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	er := &lethev1.ErasureRequest{}
	er.Namespace, er.Name = e.ns, "oops"
	waitPhase(t, er, lethev1.PhaseTombstoned)
	if out, err := kubectlErasure(t, e.ns, "cancel", "oops"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	waitPhase(t, er, lethev1.PhaseCancelled)
	if n := e.sessionRows(t, keptB); n == 0 {
		t.Fatal("the cancelled session's rows are gone")
	}
}

// A request whose store does not exist stalls: `create --wait` ends with exit
// 1 naming the stalled step, and `status` names the condition and its reason.
func TestPluginNamesTheStepAStalledRequestWaitsOn(t *testing.T) {
	e := newMemoryEnv(t, "plugin-stalled")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, stderr, err := kubectlErasureCtx(ctx, t, e.ns, "create", "stuck", "--store", "no-such-store", "--session-id", keptB,
		"--immediate", "--reason", "ticket", "--wait", "--timeout", "40s")
	var exit *erasurecli.ExitError
	if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), lethev1.ConditionTombstoned) {
		t.Fatalf("--wait on a stalled request: %v\n%s", err, stderr)
	}
	out, err := kubectlErasure(t, e.ns, "status", "stuck")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{lethev1.ConditionStalled, lethev1.ConditionTombstoned, lethev1.ReasonStoreNotFound} {
		if !strings.Contains(out, want) {
			t.Errorf("status of a stalled request lacks %q:\n%s", want, out)
		}
	}
	if n := e.sessionRows(t, keptB); n == 0 {
		t.Error("a request on a missing store touched the session")
	}
}
