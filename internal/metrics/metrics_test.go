package metrics

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNamesDescribesVectorsWithoutChildren(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_never_incremented_total", Help: "h"}, []string{"kind"})
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "test", Name: "gauge", Help: "h"})
	got := Names(vec, gauge, vec)
	want := []string{"test_gauge", "test_never_incremented_total"}
	if !slices.Equal(got, want) {
		t.Errorf("Names = %v, want %v", got, want)
	}
}

func TestCollectorsAreTheRegisteredMetrics(t *testing.T) {
	names := Names(Collectors()...)
	for _, n := range []string{"lethe_graph_pruned_total", "lethe_graph_sweeps_total", "lethe_graph_sweep_removed_total",
		"lethe_graph_sweep_last_completion_timestamp_seconds", "lethe_graph_provenanceless_elements", "lethe_graph_sweep_duration_seconds",
		"lethe_erasure_step_duration_seconds", "lethe_erasure_rows_deleted_total",
		"lethe_tombstone_reaper_sessions_deleted_total", "lethe_backups_changed_total", "lethe_memorystore_last_audit_timestamp_seconds"} {
		if !slices.Contains(names, n) {
			t.Errorf("%s missing from Names(Collectors()...) = %v", n, names)
		}
	}
	if len(names) != len(Collectors()) {
		t.Errorf("%d names for %d collectors: %v", len(names), len(Collectors()), names)
	}
}
