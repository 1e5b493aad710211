package erasurecli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

const idA, idB = "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f", "0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f"

var now = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

func TestRequestValidationNamesEveryProblem(t *testing.T) {
	for name, tc := range map[string]struct {
		flags specFlags
		req   string
		want  []string
	}{
		"no store, no ids":     {specFlags{}, "r", []string{"--store is required", "at least one --session-id"}},
		"bad uuid, duplicate":  {specFlags{store: "m", ids: []string{"NOT-A-UUID", idA, idA}}, "r", []string{`"NOT-A-UUID" is not a lowercase canonical UUID`, `session "` + idA + `" is listed twice`}},
		"immediate, no reason": {specFlags{store: "m", ids: []string{idA}, immediate: true, reason: "  "}, "r", []string{"--immediate needs --reason"}},
		"immediate and grace":  {specFlags{store: "m", ids: []string{idA}, immediate: true, reason: "x", grace: time.Hour}, "r", []string{"--immediate and --grace exclude each other"}},
		"negative grace":       {specFlags{store: "m", ids: []string{idA}, grace: -time.Hour}, "r", []string{"--grace must not be negative"}},
		"bad name and store":   {specFlags{store: "Memory", ids: []string{idA}}, "Bad_Name", []string{`name "Bad_Name"`, `--store "Memory"`}},
		"requested-at format":  {specFlags{store: "m", ids: []string{idA}, requestedAt: "2026-11-02"}, "r", []string{`--requested-at "2026-11-02" is not an RFC 3339 time`}},
		"requested-at future":  {specFlags{store: "m", ids: []string{idA}, requestedAt: "2026-11-21T00:00:00Z"}, "r", []string{"--requested-at is in the future"}},
		"too many":             {specFlags{store: "m", ids: manyIDs(1001)}, "r", []string{"1001 session IDs: at most 1000"}},
	} {
		t.Run(name, func(t *testing.T) {
			er, err := tc.flags.request(tc.req, "ns", strings.NewReader(""), now)
			if err == nil {
				t.Fatalf("accepted: %+v", er.Spec)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func manyIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%012d", idA[:24], i)
	}
	return ids
}

func TestRequestBuildsTheSpec(t *testing.T) {
	f := specFlags{store: "memory", ids: []string{idA}, idsFile: "-", grace: 72 * time.Hour, requestedAt: "2026-11-02T10:30:00.75+01:00"}
	er, err := f.request("forget", "apps", strings.NewReader("# comment\n\n"+idB+"\n"), now)
	if err != nil {
		t.Fatal(err)
	}
	want := lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "memory"},
		SessionIDs:  []lethev1.SessionID{idA, idB},
		GracePeriod: durationPtr(72 * time.Hour),
		RequestedAt: timePtr(time.Date(2026, 11, 2, 9, 30, 0, 0, time.UTC))}
	if !equality.Semantic.DeepEqual(er.Spec, want) {
		t.Fatalf("spec %+v, want %+v", er.Spec, want)
	}
	if er.APIVersion != "erasure.lethe.dev/v1alpha1" || er.Kind != "ErasureRequest" || er.Namespace != "apps" || er.Name != "forget" {
		t.Fatalf("meta: %+v %+v", er.TypeMeta, er.ObjectMeta)
	}
	if deadlinePassed(er, now) {
		t.Fatal("a request of 18 days ago is not late")
	}
	if !deadlinePassed(er, now.AddDate(0, 1, 0)) {
		t.Fatal("a request of a month and 18 days ago is late")
	}
}

// runCLI runs the plugin in-process without a cluster (export, completion, version --client).
func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	// The kubeconfig flag goes before the last word: __complete completes that.
	cmd.SetArgs(append([]string{args[0], "--kubeconfig", "/nonexistent"}, args[1:]...))
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestExportPrintsAManifestThatRoundTrips(t *testing.T) {
	out, _, err := runCLI(t, "create", "forget", "-n", "apps", "--store", "memory", "--session-id", idA, "--session-id", idB,
		"--grace", "90m", "--requested-at", "2026-11-02T09:30:00Z", "--export")
	if err != nil {
		t.Fatal(err)
	}
	for _, unwanted := range []string{"status", "creationTimestamp", "resourceVersion", "uid", "1h30m0s"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("the manifest has %q:\n%s", unwanted, out)
		}
	}
	got := &lethev1.ErasureRequest{}
	if err := yaml.UnmarshalStrict([]byte(out), got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f := specFlags{store: "memory", ids: []string{idA, idB}, grace: 90 * time.Minute, requestedAt: "2026-11-02T09:30:00Z"}
	want, err := f.request("forget", "apps", nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	if !strings.Contains(out, "gracePeriod: 1h30m\n") {
		t.Errorf("grace period not as written:\n%s", out)
	}

	// Without -n, no namespace: the GitOps tool's destination applies.
	out, _, err = runCLI(t, "create", "forget", "--store", "memory", "--session-id", idA, "--export", "-o", "json")
	if err != nil || strings.Contains(out, "namespace") || !strings.Contains(out, `"kind": "ErasureRequest"`) {
		t.Fatalf("json export without -n: %v\n%s", err, out)
	}
}

func TestExportValidatesLikeCreateAndPrintsNothingOnError(t *testing.T) {
	for _, args := range [][]string{
		{"--session-id", "NOT-A-UUID"},
		{"--session-id", idA, "--session-id", idA},
		{"--session-id", idA, "--immediate"},
		{"--session-id", idA, "-o", "table"},
		{"--session-id", idA, "--wait"},
	} {
		out, _, err := runCLI(t, append([]string{"create", "forget", "--store", "memory", "--export"}, args...)...)
		if err == nil || out != "" {
			t.Errorf("%v: err %v, printed:\n%s", args, err, out)
		}
	}
}

func TestDryRunPointsAtPlan(t *testing.T) {
	_, _, err := runCLI(t, "create", "forget", "--store", "memory", "--session-id", idA, "--dry-run")
	if err == nil || !strings.Contains(err.Error(), "kubectl erasure plan") {
		t.Fatalf("--dry-run: %v", err)
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{168 * time.Hour: "168h", 90 * time.Minute: "1h30m", time.Minute: "1m",
		10 * time.Minute: "10m", 90 * time.Second: "1m30s", 0: "0s", 1500 * time.Millisecond: "1.5s", time.Hour + time.Second: "1h0m1s"} {
		if got := shortDuration(d); got != want {
			t.Errorf("%v: got %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(shortDuration(d)); err != nil || back != d {
			t.Errorf("%v does not parse back: %v %v", d, back, err)
		}
	}
}
