package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
)

var uuidLike = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-`)

// flatten turns gathered families into name{label=value,...} -> value
// (histograms: their sample count), and checks that no label names anyone.
func flatten(t *testing.T, mfs []*dto.MetricFamily, forbidden ...string) map[string]float64 {
	t.Helper()
	values := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "lethe_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				// S4: labels are kinds, phases, steps, tables, namespaces and store names only.
				bad := uuidLike.MatchString(l.GetValue()) || strings.Contains(l.GetValue(), marker)
				for _, f := range forbidden {
					bad = bad || l.GetValue() == f
				}
				if bad {
					t.Errorf("metric %s has label %s=%q", mf.GetName(), l.GetName(), l.GetValue())
				}
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
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
	return values
}

func TestMetricsCountTheWorkWithoutNamingAnyone(t *testing.T) {
	e := newMemoryEnv(t, "metrics")
	er := e.request(t, "forget", nil)
	waitPhase(t, er, lethev1.PhaseBackupsRotated)

	// The collector reads the manager's cache, which may lag the API
	// server the wait read from: gather until it has caught up.
	var values map[string]float64
	eventually(t, 30*time.Second, func() error {
		mfs, err := crmetrics.Registry.Gather()
		if err != nil {
			return err
		}
		values = flatten(t, mfs, er.Name)
		for _, name := range []string{controllers.MetricDeadlineEarliest, controllers.MetricLiveDataDeadline} {
			if v, ok := values[name+"{namespace="+e.ns+"}"]; ok {
				return fmt.Errorf("%s{namespace=%s} = %v for a completed request, want no series", name, e.ns, v)
			}
		}
		return nil
	})
	for key, atLeast := range map[string]float64{
		"lethe_collector_last_list_success":                             1,
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
}

// The deadline gauges of a real request, read by the manager's registered
// collector, are its status.deadline as a Unix time; a request filed 29 days
// after the subject asked, with the default week of grace, is projected late.
func TestMetricsDeadlineIsTheRequestsStatusDeadline(t *testing.T) {
	e := newMemoryEnv(t, "metrics-deadline")
	asked := metav1.NewTime(time.Now().Add(-29 * 24 * time.Hour).Truncate(time.Second))
	er := e.request(t, "late", func(er *lethev1.ErasureRequest) {
		er.Spec.Immediate, er.Spec.Reason = false, ""
		er.Spec.RequestedAt = &asked
	})
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if er.Status.Deadline == nil || er.Status.GraceEndsAt == nil {
			return fmt.Errorf("no deadline or graceEndsAt yet; conditions %s", conditionsString(er.Status.Conditions))
		}
		return nil
	})
	want := float64(er.Status.Deadline.Unix())
	if !er.Status.GraceEndsAt.After(er.Status.Deadline.Time) {
		t.Fatalf("graceEndsAt %s is not after deadline %s: the test's premise is wrong", er.Status.GraceEndsAt, er.Status.Deadline)
	}
	eventually(t, 10*time.Second, func() error {
		mfs, err := crmetrics.Registry.Gather()
		if err != nil {
			return err
		}
		values := flatten(t, mfs, er.Name)
		for key, w := range map[string]float64{
			"lethe_collector_last_list_success":                                              1,
			controllers.MetricDeadlineEarliest + "{namespace=" + e.ns + "}":                  want,
			controllers.MetricLiveDataDeadline + "{namespace=" + e.ns + "}":                  want,
			controllers.MetricProjectedLate + "{namespace=" + e.ns + ",step=Deleted}":        1,
			controllers.MetricProjectedLate + "{namespace=" + e.ns + ",step=BackupsRotated}": 0,
		} {
			if got, ok := values[key]; !ok || got != w {
				return fmt.Errorf("%s = %v (exported: %v), want %v", key, got, ok, w)
			}
		}
		return nil
	})
}

// collect runs one scrape of a request collector over objs (a pedantic
// registry also checks that what is collected matches what is described).
func collect(t *testing.T, reader client.Reader) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(controllers.NewRequestCollector(reader))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return flatten(t, mfs)
}

func fakeReader(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

func TestRequestCollectorReportsAFailedList(t *testing.T) {
	s := runtime.NewScheme()
	if err := lethev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	failing := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errors.New("informer cache not synced")
		},
	}).Build()
	values := collect(t, failing)
	if got, ok := values[controllers.MetricCollectorListSuccess]; !ok || got != 0 {
		t.Errorf("%s = %v (exported: %v), want 0", controllers.MetricCollectorListSuccess, got, ok)
	}
	// Nothing else: zeroes would read as "no request at risk".
	if len(values) != 1 {
		t.Errorf("a failed list exported %v, want only %s", values, controllers.MetricCollectorListSuccess)
	}

	values = collect(t, fakeReader(t))
	if got := values[controllers.MetricCollectorListSuccess]; got != 1 {
		t.Errorf("%s = %v after a successful list, want 1", controllers.MetricCollectorListSuccess, got)
	}
	if got, ok := values["lethe_erasure_requests{phase=Pending}"]; !ok || got != 0 {
		t.Errorf("lethe_erasure_requests{phase=Pending} = %v (exported: %v), want 0", got, ok)
	}
}

// day is an anchor in the past: the collector never reads the clock, so the
// same values come out whenever the test runs.
var day0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func at(days float64) *metav1.Time {
	t := metav1.NewTime(day0.Add(time.Duration(days * 24 * float64(time.Hour))))
	return &t
}

func conds(types ...string) []metav1.Condition {
	var cs []metav1.Condition
	for _, ty := range types {
		cs = append(cs, metav1.Condition{Type: ty, Status: metav1.ConditionTrue, Reason: "Done", LastTransitionTime: metav1.NewTime(day0)})
	}
	return cs
}

func requestIn(ns, name string, phase lethev1.Phase, deadline, graceEnds *metav1.Time, c []metav1.Condition, bs ...lethev1.BackupEvidence) *lethev1.ErasureRequest {
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	er.Status = lethev1.ErasureRequestStatus{Phase: phase, Deadline: deadline, GraceEndsAt: graceEnds, Conditions: c}
	if len(bs) > 0 {
		er.Status.Evidence = &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{{Step: lethev1.ConditionBackupsRotated, Backups: bs}}}
	}
	return er
}

func TestRequestCollectorDeadlinesByNamespace(t *testing.T) {
	deleted := conds(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted)
	reconciled := conds(lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted, lethev1.ConditionGraphReconciled)
	cancelled := []metav1.Condition{{Type: lethev1.ConditionGracePeriodElapsed, Status: metav1.ConditionFalse, Reason: lethev1.ReasonCancelled, LastTransitionTime: metav1.NewTime(day0)}}
	objs := []client.Object{
		// waiting: a default request that deleted its data on day 7 and waits
		// for two Backups expiring on days 20 and 25, inside its month (day 31).
		requestIn("waiting", "w1", lethev1.PhaseGraphReconciled, at(31), at(7), reconciled,
			lethev1.BackupEvidence{Name: "b1", Expiration: at(20)},
			lethev1.BackupEvidence{Name: "b2", Expiration: at(25)},
			lethev1.BackupEvidence{Name: "b3", Expiration: at(40), GoneAt: at(8)}), // gone: no longer waited on
		// at-risk: one still in its grace period that ends after its deadline,
		// one deleted but waiting on a Backup that outlives its deadline, and
		// one in Deleted (graph not pruned) with the earliest deadline.
		requestIn("at-risk", "r1", lethev1.PhaseTombstoned, at(30), at(33), conds(lethev1.ConditionTombstoned)),
		requestIn("at-risk", "r2", lethev1.PhaseGraphReconciled, at(35), at(10), reconciled,
			lethev1.BackupEvidence{Name: "b4", Expiration: at(36)}),
		requestIn("at-risk", "r3", lethev1.PhaseDeleted, at(29), at(5), deleted),
		// finished or stopped requests count by phase only.
		requestIn("done", "d1", lethev1.PhaseBackupsRotated, at(2), at(1), append(reconciled, conds(lethev1.ConditionBackupsRotated)...)),
		requestIn("done", "c1", lethev1.PhaseCancelled, at(3), at(4), cancelled),
	}
	values := collect(t, fakeReader(t, objs...))
	ts := func(days float64) float64 { return float64(at(days).Unix()) }
	want := map[string]float64{
		"lethe_collector_last_list_success":                                         1,
		"lethe_erasure_requests{phase=GraphReconciled}":                             2,
		"lethe_erasure_requests{phase=Tombstoned}":                                  1,
		"lethe_erasure_requests{phase=Deleted}":                                     1,
		"lethe_erasure_requests{phase=BackupsRotated}":                              1,
		"lethe_erasure_requests{phase=Cancelled}":                                   1,
		"lethe_erasure_requests{phase=Pending}":                                     0,
		"lethe_erasure_requests_stalled":                                            0,
		controllers.MetricDeadlineEarliest + "{namespace=waiting}":                  ts(31),
		controllers.MetricBackupsExpireBy + "{namespace=waiting}":                   ts(25),
		controllers.MetricProjectedLate + "{namespace=waiting,step=Deleted}":        0,
		controllers.MetricProjectedLate + "{namespace=waiting,step=BackupsRotated}": 0,
		controllers.MetricDeadlineEarliest + "{namespace=at-risk}":                  ts(29),
		controllers.MetricLiveDataDeadline + "{namespace=at-risk}":                  ts(29),
		controllers.MetricBackupsExpireBy + "{namespace=at-risk}":                   ts(36),
		controllers.MetricProjectedLate + "{namespace=at-risk,step=Deleted}":        1,
		controllers.MetricProjectedLate + "{namespace=at-risk,step=BackupsRotated}": 1,
	}
	for key, w := range want {
		if got, ok := values[key]; !ok || got != w {
			t.Errorf("%s = %v (exported: %v), want %v", key, got, ok, w)
		}
	}
	for key, v := range values {
		if _, ok := want[key]; !ok && !strings.HasPrefix(key, "lethe_erasure_requests{phase=") {
			// The waiting namespace has no live data; done has nothing unfinished.
			t.Errorf("unexpected series %s = %v", key, v)
		}
	}
}
