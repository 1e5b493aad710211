package controllers_test

import (
	"regexp"
	"strings"
	"testing"

	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

var uuidLike = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-`)

func TestMetricsCountTheWorkWithoutNamingAnyone(t *testing.T) {
	e := newMemoryEnv(t, "metrics")
	er := e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)

	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "lethe_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				// S4: labels are kinds, phases, tables and store names only.
				if uuidLike.MatchString(l.GetValue()) || strings.Contains(l.GetValue(), marker) || l.GetValue() == er.Name {
					t.Errorf("metric %s has label %s=%q", mf.GetName(), l.GetName(), l.GetValue())
				}
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				values[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				values[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				values[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for key, atLeast := range map[string]float64{
		"lethe_erasure_requests{phase=BackupsRotated}":                  1,
		"lethe_erasure_rows_deleted_total{table=memory.sessions}":       2,
		"lethe_tombstone_reaper_sessions_deleted_total{mode=immediate}": 2,
		"lethe_erasure_step_duration_seconds{phase=Deleted}":            1,
		"lethe_erasure_step_duration_seconds{phase=BackupsRotated}":     1,
	} {
		if values[key] < atLeast {
			t.Errorf("%s = %v, want at least %v", key, values[key], atLeast)
		}
	}
	if _, ok := values["lethe_erasure_deadline_min_seconds"]; !ok {
		t.Error("lethe_erasure_deadline_min_seconds is not exported")
	}
}
