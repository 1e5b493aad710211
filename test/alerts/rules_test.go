// Package alerts tests Lethe's alert rules (config/prometheus/rules.yaml) with
// promtool, the tool Prometheus ships for it: `promtool check rules` and
// `promtool test rules` on every *.test.yaml here. It also checks that every
// alert has a runbook section and a test where it fires and one where it
// does not, and that the rules query only metrics Lethe exports.
package alerts

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/metrics"
)

const runbookBase = "https://github.com/lethe-dev/lethe/blob/main/docs/runbook.md#"

// repoRoot is the directory of go.mod above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// promtool is LETHE_PROMTOOL or bin/promtool; a missing one fails the test.
func promtool(t *testing.T) string {
	t.Helper()
	p := os.Getenv("LETHE_PROMTOOL")
	if p == "" {
		p = filepath.Join(repoRoot(t), "bin", "promtool")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("promtool not found at %s (LETHE_PROMTOOL or bin/promtool): run `make promtool` to build it", p)
	}
	return p
}

type rule struct {
	Record      string            `json:"record"`
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

// ruleFile reads the PrometheusRule and returns its spec: a Prometheus rule
// file (the operator hands spec.groups to Prometheus as they are).
func ruleFile(t *testing.T) ([]byte, []rule) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "prometheus", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Kind string          `json:"kind"`
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Kind != "PrometheusRule" || len(pr.Spec) == 0 {
		t.Fatalf("config/prometheus/rules.yaml: kind %q with spec of %d bytes, want a PrometheusRule with a spec", pr.Kind, len(pr.Spec))
	}
	var g ruleGroups
	if err := yaml.UnmarshalStrict(pr.Spec, &g); err != nil {
		t.Fatalf("config/prometheus/rules.yaml spec: %v", err)
	}
	var rules []rule
	for _, gr := range g.Groups {
		rules = append(rules, gr.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("config/prometheus/rules.yaml has no rule")
	}
	spec, err := yaml.JSONToYAML(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return spec, rules
}

// workdir holds rules.yaml (the spec) and a copy of every test file, as the
// test files name `rules.yaml` relative to themselves.
func workdir(t *testing.T) (dir string, tests []string) {
	t.Helper()
	dir = t.TempDir()
	spec, _ := ruleFile(t)
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*.test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no *.test.yaml in test/alerts")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
		tests = append(tests, filepath.Join(dir, f))
	}
	return dir, tests
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func TestPromtoolCheckRules(t *testing.T) {
	pt := promtool(t)
	dir, _ := workdir(t)
	out := run(t, pt, "check", "rules", "--lint=all", "--lint-fatal", filepath.Join(dir, "rules.yaml"))
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules did not report SUCCESS:\n%s", out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	pt := promtool(t)
	_, tests := workdir(t)
	out := run(t, pt, append([]string{"test", "rules"}, tests...)...)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules did not report SUCCESS:\n%s", out)
	}
	t.Log(out)
}

// A heading's anchor as GitHub makes it: lowercase, spaces to dashes, other
// punctuation dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func TestEveryAlertHasARunbookSectionAndBothOutcomesTested(t *testing.T) {
	_, rules := ruleFile(t)
	root := repoRoot(t)
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, line := range strings.Split(string(runbook), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			sections[anchor(h)] = true
		}
	}
	fires, silent := map[string]int{}, map[string]int{}
	files, _ := filepath.Glob("*.test.yaml")
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pt promtoolTests
		if err := yaml.Unmarshal(raw, &pt); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !slices.Equal(pt.RuleFiles, []string{"rules.yaml"}) {
			t.Errorf("%s: rule_files %v, want [rules.yaml] (the test runs it beside the PrometheusRule's spec)", f, pt.RuleFiles)
		}
		for _, tc := range pt.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname]++
				} else {
					silent[a.Alertname]++
				}
			}
		}
	}
	for _, r := range rules {
		if r.Alert == "" {
			continue
		}
		url := r.Annotations["runbook_url"]
		a, ok := strings.CutPrefix(url, runbookBase)
		switch {
		case !ok:
			t.Errorf("%s: runbook_url %q does not start with %s", r.Alert, url, runbookBase)
		case !sections[a]:
			t.Errorf("%s: runbook_url %q names no section of docs/runbook.md", r.Alert, url)
		case a != anchor(r.Alert):
			t.Errorf("%s: runbook_url points at #%s, want the alert's own section #%s", r.Alert, a, anchor(r.Alert))
		}
		if r.Labels["severity"] != "critical" && r.Labels["severity"] != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, r.Labels["severity"])
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: needs a summary and a description", r.Alert)
		}
		if fires[r.Alert] == 0 {
			t.Errorf("%s: no promtool test where it fires", r.Alert)
		}
		if silent[r.Alert] == 0 {
			t.Errorf("%s: no promtool test where it stays silent", r.Alert)
		}
	}
}

var letheMetric = regexp.MustCompile(`\blethe_[a-z0-9_]+`)

// Exported lists every metric name the manager can export: the request
// collector's and internal/metrics' (histograms with their series suffixes).
func exported() map[string]bool {
	names := metrics.Names(append(metrics.Collectors(), controllers.NewRequestCollector(nil))...)
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			m[n+s] = true
		}
	}
	return m
}

func TestRulesQueryOnlyExportedMetrics(t *testing.T) {
	_, rules := ruleFile(t)
	known := exported()
	if !known[controllers.MetricCollectorListSuccess] || !known["lethe_erasure_step_duration_seconds_bucket"] {
		t.Fatalf("the exported names look wrong: %v", known)
	}
	for _, r := range rules {
		for _, m := range letheMetric.FindAllString(r.Expr, -1) {
			if !known[m] {
				t.Errorf("%s queries %s, which Lethe does not export", r.Alert, m)
			}
		}
	}
}

// The rules group and name by the metrics' own namespace label (a request's
// or a store's). The ServiceMonitor that scrapes the manager must keep it
// (honorLabels): otherwise the Prometheus Operator's scrape sets namespace
// to the manager's own and renames the metric's to exported_namespace. The
// chart's ServiceMonitor is checked in charts/lethe.
func TestTheServiceMonitorKeepsTheMetricsNamespace(t *testing.T) {
	_, rules := ruleFile(t)
	byNamespace := 0
	for _, r := range rules {
		if strings.Contains(r.Annotations["summary"], "$labels.namespace") {
			byNamespace++
		}
	}
	if byNamespace == 0 {
		t.Fatal("no alert names $labels.namespace: this test has lost its reason")
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "prometheus", "monitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var sm struct {
		Kind string `json:"kind"`
		Spec struct {
			Endpoints []struct {
				Port        string `json:"port"`
				HonorLabels bool   `json:"honorLabels"`
			} `json:"endpoints"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &sm); err != nil {
		t.Fatal(err)
	}
	if sm.Kind != "ServiceMonitor" || len(sm.Spec.Endpoints) == 0 {
		t.Fatalf("config/prometheus/monitor.yaml is not a ServiceMonitor with endpoints: %+v", sm)
	}
	for _, ep := range sm.Spec.Endpoints {
		if !ep.HonorLabels {
			t.Errorf("endpoint %q does not honor the metrics' labels: %d alerts would name the manager's namespace", ep.Port, byNamespace)
		}
	}
}

// descLabels is the label names of a metric description (its String form
// is the only place client_golang shows them).
var descLabels = regexp.MustCompile(`fqName: "([^"]+)".*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}`)

// With honorLabels, a metric's own label wins over the scrape's target
// label of the same name: a Lethe metric labelled job, instance or pod
// would hide which target it came from. Only namespace is meant to win.
func TestNoMetricLabelTakesATargetLabelsPlace(t *testing.T) {
	target := map[string]bool{"job": true, "instance": true, "pod": true, "service": true, "endpoint": true, "container": true}
	seen := 0
	for _, c := range append(metrics.Collectors(), controllers.NewRequestCollector(nil)) {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descLabels.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the labels of %s", d)
			}
			seen++
			for _, l := range strings.FieldsFunc(m[2]+","+m[3], func(r rune) bool { return r == ',' }) {
				name, _, _ := strings.Cut(l, "=")
				name = strings.TrimSuffix(strings.TrimPrefix(name, "c("), ")")
				if target[name] {
					t.Errorf("%s has the label %q, which would replace the scrape target's", m[1], name)
				}
			}
		}
	}
	if seen < 10 {
		t.Fatalf("only %d metrics described: the collectors look wrong", seen)
	}
}
