package alerts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/yaml"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

// From status to page: ErasureRequests go through the manager's real
// collector, its output becomes promtool's input series, and promtool
// evaluates the real rules. Prometheus's clock starts at the Unix epoch in a
// unit test, so the requests' times are days after it.

func day(d float64) *metav1.Time {
	t := metav1.NewTime(time.Unix(0, 0).Add(time.Duration(d * 24 * float64(time.Hour))).UTC())
	return &t
}

func trueConds(types ...string) []metav1.Condition {
	var cs []metav1.Condition
	for _, ty := range types {
		cs = append(cs, metav1.Condition{Type: ty, Status: metav1.ConditionTrue, Reason: "Done", LastTransitionTime: *day(0)})
	}
	return cs
}

// scrape runs the collector once over reader and returns promtool input
// series, each holding its value for the whole test.
func scrape(t *testing.T, reader client.Reader, samples int) []map[string]string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(controllers.NewRequestCollector(reader))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []map[string]string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := []string{`job="lethe-metrics"`, `instance="10.0.0.5:8080"`}
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := strconv.FormatFloat(m.GetGauge().GetValue(), 'f', -1, 64)
			series = append(series, map[string]string{
				"series": mf.GetName() + "{" + strings.Join(labels, ", ") + "}",
				"values": fmt.Sprintf("%sx%d", v, samples),
			})
		}
	}
	return series
}

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

type alertTest struct {
	EvalTime  string           `json:"eval_time"`
	Alertname string           `json:"alertname"`
	ExpAlerts []map[string]any `json:"exp_alerts"`
}

// promtoolRun writes one test file beside the rules and runs it.
func promtoolRun(t *testing.T, name string, series []map[string]string, cases []alertTest) {
	t.Helper()
	pt := promtool(t)
	dir, _ := workdir(t)
	doc := map[string]any{
		"rule_files":          []string{"rules.yaml"},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"name": name, "interval": "1m", "input_series": series, "alert_rule_test": cases,
		}},
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "generated.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out := run(t, pt, "test", "rules", f)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules did not report SUCCESS:\n%s\n%s", out, b)
	}
}

func TestCollectorOutputPagesOnRealRiskOnly(t *testing.T) {
	reconciled := trueConds(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted, lethev1.ConditionGraphReconciled)
	// waiting: a default request that deleted and pruned its data and waits
	// for Velero Backups that expire tomorrow, inside its month (deadline in 2 days).
	waiting := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "waiting", Name: "w"}}
	waiting.Status = lethev1.ErasureRequestStatus{Phase: lethev1.PhaseGraphReconciled, Deadline: day(2), GraceEndsAt: day(-20), Conditions: reconciled,
		Evidence: &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{{Step: lethev1.ConditionBackupsRotated,
			Backups: []lethev1.BackupEvidence{{Name: "b1", Expiration: day(0.5)}, {Name: "b2", Expiration: day(1)}}}}}}
	// at-risk: tombstoned, its grace period over, not deleted (the database
	// is unreachable), deadline in 2 days.
	atRisk := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "at-risk", Name: "r"}}
	atRisk.Status = lethev1.ErasureRequestStatus{Phase: lethev1.PhaseGracePeriod, Deadline: day(2), GraceEndsAt: day(-1),
		Conditions: trueConds(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed)}
	reader := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(waiting, atRisk).Build()
	series := scrape(t, reader, 120)

	// The premise: by "seconds left" both are 2 days from their deadline, so
	// the rule this replaced paged for both.
	var found int
	for _, s := range series {
		if strings.HasPrefix(s["series"], controllers.MetricDeadlineEarliest+"{") {
			found++
			if s["values"] != "172800x120" {
				t.Errorf("%s = %s, want the deadline of day 2 (172800) in both namespaces", s["series"], s["values"])
			}
		}
	}
	if found != 2 {
		t.Fatalf("%d %s series, want 2: %v", found, controllers.MetricDeadlineEarliest, series)
	}

	none := []map[string]any{}
	promtoolRun(t, "collector output: at risk vs waiting for backups", series, []alertTest{
		{EvalTime: "1h", Alertname: "LetheErasureDeadlineAtRisk", ExpAlerts: []map[string]any{{
			"exp_labels": map[string]string{"severity": "critical", "namespace": "at-risk", "job": "lethe-metrics", "instance": "10.0.0.5:8080"},
			"exp_annotations": map[string]string{
				"summary":     "An erasure request in at-risk has not deleted its data and its deadline is near",
				"description": "The earliest deadline of a request in at-risk whose sessions are not yet deleted (or not yet pruned from the graph) is 1d 23h 0m 0s away (negative: passed).",
				"runbook_url": runbookBase + "letheerasuredeadlineatrisk",
			},
		}}},
		{EvalTime: "1h", Alertname: "LetheErasureGraceEndsAfterDeadline", ExpAlerts: none},
		{EvalTime: "1h", Alertname: "LetheErasureBackupsOutliveDeadline", ExpAlerts: none},
		{EvalTime: "1h", Alertname: "LetheManagerDown", ExpAlerts: none},
		{EvalTime: "1h", Alertname: "LetheMetricsCollectorFailing", ExpAlerts: none},
	})
}

func TestCollectorOutputOfAFailedListPages(t *testing.T) {
	failing := fake.NewClientBuilder().WithScheme(scheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errors.New("informer cache not synced")
		},
	}).Build()
	series := scrape(t, failing, 30)
	names := []string{}
	for _, s := range series {
		names = append(names, s["series"])
	}
	if !slices.Equal(names, []string{controllers.MetricCollectorListSuccess + `{job="lethe-metrics", instance="10.0.0.5:8080"}`}) {
		t.Fatalf("a failed list exported %v, want only %s", names, controllers.MetricCollectorListSuccess)
	}
	none := []map[string]any{}
	promtoolRun(t, "collector output: the list fails", series, []alertTest{
		{EvalTime: "5m", Alertname: "LetheMetricsCollectorFailing", ExpAlerts: none},
		{EvalTime: "15m", Alertname: "LetheMetricsCollectorFailing", ExpAlerts: []map[string]any{{
			"exp_labels": map[string]string{"severity": "critical", "job": "lethe-metrics", "instance": "10.0.0.5:8080"},
			"exp_annotations": map[string]string{
				"summary":     "Lethe cannot list ErasureRequests for its metrics (10.0.0.5:8080)",
				"description": "The manager answers scrapes but its list of ErasureRequests from its cache fails, so it exports no request or deadline metric: the deadline alerts cannot fire.",
				"runbook_url": runbookBase + "lethemetricscollectorfailing",
			},
		}}},
		{EvalTime: "15m", Alertname: "LetheManagerDown", ExpAlerts: none},
	})
}
