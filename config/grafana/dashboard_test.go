// Package grafana holds Lethe's Grafana dashboard (lethe-dashboard.json; the
// chart ships a copy as an optional ConfigMap). The test keeps it from
// drifting: it parses, and every Lethe metric it queries is one the manager
// exports.
package grafana

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/metrics"
)

type panel struct {
	ID      int    `json:"id"`
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
	Panels  []panel                   `json:"panels"`
}

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
}

var (
	metricName = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*\b`)
	// Words of PromQL and Grafana that are not metric names.
	promql = []string{"sum", "min", "max", "avg", "count", "by", "without", "rate", "increase", "irate",
		"histogram_quantile", "time", "le", "__rate_interval", "__range", "__interval",
		"and", "or", "unless", "on", "ignoring", "offset", "bool", "absent"}
	// Series Prometheus itself makes for every target.
	fromPrometheus = []string{"up"}
)

func TestDashboardQueriesOnlyExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("lethe-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("lethe-dashboard.json does not parse: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
		t.Errorf("dashboard uid %q, title %q, schemaVersion %d: all three are needed for Grafana to import it", d.UID, d.Title, d.SchemaVersion)
	}

	exported := map[string]bool{}
	for _, n := range metrics.Names(append(metrics.Collectors(), controllers.NewRequestCollector(nil))...) {
		exported[n] = true
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			exported[n+s] = true
		}
	}
	if !exported[controllers.MetricDeadlineEarliest] || !exported["lethe_graph_sweeps_total"] {
		t.Fatalf("the exported names look wrong: %v", exported)
	}

	var queried []string
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos == nil {
				t.Errorf("panel %q has no gridPos", p.Title)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q queries nothing", p.Title)
			}
			for _, tg := range p.Targets {
				for _, w := range metricName.FindAllString(stripStrings(tg.Expr), -1) {
					switch {
					case slices.Contains(promql, w), slices.Contains(fromPrometheus, w):
					case exported[w]:
						queried = append(queried, w)
					default:
						t.Errorf("panel %q queries %q, which Lethe does not export (expr %s)", p.Title, w, tg.Expr)
					}
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)

	// What the issue asks the dashboard to show.
	for _, m := range []string{controllers.MetricRequests, controllers.MetricLiveDataDeadline, controllers.MetricDeadlineEarliest,
		"lethe_erasure_step_duration_seconds_bucket", "lethe_erasure_rows_deleted_total", "lethe_graph_sweeps_total",
		"lethe_backups_changed_total", controllers.MetricCollectorListSuccess} {
		if !slices.Contains(queried, m) {
			t.Errorf("the dashboard does not show %s", m)
		}
	}
}

var (
	quoted = regexp.MustCompile(`"[^"]*"`)
	// Grouping labels (by (phase)), label matchers ({phase="x"}) and ranges
	// ([5m]) name no metric.
	grouping = regexp.MustCompile(`\b(by|without|on|ignoring)\s*\([^)]*\)`)
	braces   = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	numbers  = regexp.MustCompile(`\b[0-9.]+\b`)
)

// stripStrings leaves only the metric and function names of a query.
func stripStrings(expr string) string {
	expr = quoted.ReplaceAllString(expr, "")
	expr = grouping.ReplaceAllString(expr, "")
	expr = braces.ReplaceAllString(expr, "")
	return numbers.ReplaceAllString(expr, "")
}
