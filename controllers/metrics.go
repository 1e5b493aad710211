package controllers

import (
	"context"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// requestCollector reports, at each scrape, the requests by phase, the
// stalled ones, and how close the unfinished ones are to their deadline,
// from the manager's cache. Labels are phases only: never request names.
type requestCollector struct {
	reader client.Reader
	clock  clock.PassiveClock

	byPhase, stalled, minDeadline *prometheus.Desc
	deadlines                     *prometheus.Desc
}

func newRequestCollector(reader client.Reader, clk clock.PassiveClock) *requestCollector {
	return &requestCollector{
		reader: reader, clock: clk,
		byPhase: prometheus.NewDesc("lethe_erasure_requests", "ErasureRequests by phase.", []string{"phase"}, nil),
		stalled: prometheus.NewDesc("lethe_erasure_requests_stalled", "ErasureRequests whose Stalled condition is True (a human must act).", nil, nil),
		minDeadline: prometheus.NewDesc("lethe_erasure_deadline_min_seconds",
			"Seconds left until the nearest deadline (requestedAt + 1 month) of an unfinished request; +Inf when none is unfinished.", nil, nil),
		deadlines: prometheus.NewDesc("lethe_erasure_deadline_seconds",
			"Seconds left until the deadline of each unfinished request, as a histogram.", nil, nil),
	}
}

func (c *requestCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.byPhase
	ch <- c.stalled
	ch <- c.minDeadline
	ch <- c.deadlines
}

var deadlineBuckets = []float64{0, 86400, 3 * 86400, 7 * 86400, 14 * 86400, 21 * 86400, 31 * 86400}

func (c *requestCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list := &lethev1.ErasureRequestList{}
	if err := c.reader.List(ctx, list); err != nil {
		return
	}
	phases := map[string]float64{}
	for _, p := range []lethev1.Phase{lethev1.PhasePending, lethev1.PhasePlanned, lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod,
		lethev1.PhaseDeleted, lethev1.PhaseGraphReconciled, lethev1.PhaseBackupsRotated, lethev1.PhaseCancelled, lethev1.PhaseFailed} {
		phases[string(p)] = 0
	}
	var stalled float64
	minLeft := math.Inf(1)
	buckets := map[float64]uint64{}
	var count uint64
	var sum float64
	now := c.clock.Now()
	for _, er := range list.Items {
		phase := string(er.Status.Phase)
		if phase == "" {
			phase = string(lethev1.PhasePending)
		}
		phases[phase]++
		if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionStalled) {
			stalled++
		}
		if terminal(er.Status.Conditions) || er.Status.Phase == lethev1.PhaseBackupsRotated || er.Status.Deadline == nil {
			continue
		}
		left := er.Status.Deadline.Sub(now).Seconds()
		minLeft = math.Min(minLeft, left)
		count++
		sum += left
		for _, b := range deadlineBuckets {
			if left <= b {
				buckets[b]++
			}
		}
	}
	for p, n := range phases {
		ch <- prometheus.MustNewConstMetric(c.byPhase, prometheus.GaugeValue, n, p)
	}
	ch <- prometheus.MustNewConstMetric(c.stalled, prometheus.GaugeValue, stalled)
	ch <- prometheus.MustNewConstMetric(c.minDeadline, prometheus.GaugeValue, minLeft)
	ch <- prometheus.MustNewConstHistogram(c.deadlines, count, sum, buckets)
}
