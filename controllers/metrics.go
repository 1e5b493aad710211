package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
)

// requestCollector reports, at each scrape, the requests by phase, the
// stalled ones, and the deadlines of the unfinished ones, from the manager's
// cache. Labels are phases, steps and namespaces only: never request names
// (users type them) nor session IDs.
//
// Deadlines are exported as Unix timestamps, not "seconds left": a rule
// compares them with time(), so a value stays right between scrapes and a
// stale series cannot look like slack.
type requestCollector struct {
	reader client.Reader

	listSuccess, byPhase, stalled      *prometheus.Desc
	earliestDeadline, liveDataDeadline *prometheus.Desc
	projectedLate, backupsExpireBy     *prometheus.Desc
}

// Metric names of the request collector (the rules and the dashboard use them).
const (
	MetricCollectorListSuccess = "lethe_collector_last_list_success"
	MetricRequests             = "lethe_erasure_requests"
	MetricRequestsStalled      = "lethe_erasure_requests_stalled"
	MetricDeadlineEarliest     = "lethe_erasure_deadline_earliest_timestamp_seconds"
	MetricLiveDataDeadline     = "lethe_erasure_live_data_deadline_earliest_timestamp_seconds"
	MetricProjectedLate        = "lethe_erasure_requests_projected_late"
	MetricBackupsExpireBy      = "lethe_erasure_backups_expiration_latest_timestamp_seconds"
)

// NewRequestCollector returns the collector of ErasureRequest metrics that
// the manager registers; reader is normally the manager's cached client.
// Every value is a timestamp read from status; none is computed from now.
func NewRequestCollector(reader client.Reader) prometheus.Collector {
	ns := []string{"namespace"}
	return &requestCollector{
		reader: reader,
		listSuccess: prometheus.NewDesc(MetricCollectorListSuccess,
			"1 when this scrape listed the ErasureRequests from the manager's cache, 0 when the list failed (then no other lethe_erasure_* request gauge is exported).", nil, nil),
		byPhase: prometheus.NewDesc(MetricRequests, "ErasureRequests by phase.", []string{"phase"}, nil),
		stalled: prometheus.NewDesc(MetricRequestsStalled, "ErasureRequests whose Stalled condition is True (a human must act).", nil, nil),
		earliestDeadline: prometheus.NewDesc(MetricDeadlineEarliest,
			"Unix time of the earliest status.deadline (requestedAt + 1 month) among the unfinished requests of the namespace (not BackupsRotated, cancelled or dry run).", ns, nil),
		liveDataDeadline: prometheus.NewDesc(MetricLiveDataDeadline,
			"Unix time of the earliest deadline among the unfinished requests of the namespace whose data is still live: not yet deleted from the database or not yet pruned from the graph (GraphReconciled not True).", ns, nil),
		projectedLate: prometheus.NewDesc(MetricProjectedLate,
			"Unfinished requests whose step is projected to complete after the deadline, by step: Deleted (status.graceEndsAt is after it) or BackupsRotated (a remaining Velero Backup expires after it).", []string{"namespace", "step"}, nil),
		backupsExpireBy: prometheus.NewDesc(MetricBackupsExpireBy,
			"Unix time the last remaining Velero Backup that may hold erased data expires, among the requests of the namespace waiting for BackupsRotated.", ns, nil),
	}
}

func (c *requestCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.listSuccess
	ch <- c.byPhase
	ch <- c.stalled
	ch <- c.earliestDeadline
	ch <- c.liveDataDeadline
	ch <- c.projectedLate
	ch <- c.backupsExpireBy
}

// allPhases are exported even at 0, so a phase emptying out reads 0, not absent.
var allPhases = []lethev1.Phase{lethev1.PhasePending, lethev1.PhasePlanned, lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod,
	lethev1.PhaseDeleted, lethev1.PhaseGraphReconciled, lethev1.PhaseBackupsRotated, lethev1.PhaseCancelled}

// namespaceDeadlines is what the collector keeps per namespace.
type namespaceDeadlines struct {
	earliest, liveData, backupsExpireBy time.Time
	lateDeletion, lateBackups           float64
}

func earlier(cur, t time.Time) time.Time {
	if cur.IsZero() || t.Before(cur) {
		return t
	}
	return cur
}

// Collect lists the requests from the cache and exports the success gauge
// and, when the list succeeded, the request gauges.
func (c *requestCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list := &lethev1.ErasureRequestList{}
	// Counted, never changed: a scrape copies no request.
	if err := c.reader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		// Nothing else is exported: a partial or zeroed set would read as "no
		// request at risk". The success gauge at 0 is what an alert watches.
		logf.Log.WithName("metrics").Error(err, "listing ErasureRequests for the metrics failed")
		ch <- prometheus.MustNewConstMetric(c.listSuccess, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.listSuccess, prometheus.GaugeValue, 1)
	c.export(ch, tallyRequests(list.Items))
}

// requestTally is what one scrape counts over the listed requests.
type requestTally struct {
	phases  map[string]float64
	stalled float64
	byNS    map[string]*namespaceDeadlines
}

// tallyRequests counts the requests by phase (every phase present, even at
// 0) and the stalled ones, and gathers the deadlines of the unfinished ones
// by namespace.
func tallyRequests(items []lethev1.ErasureRequest) requestTally {
	t := requestTally{phases: map[string]float64{}, byNS: map[string]*namespaceDeadlines{}}
	for _, p := range allPhases {
		t.phases[string(p)] = 0
	}
	for i := range items {
		er := &items[i]
		phase := string(er.Status.Phase)
		if phase == "" {
			phase = string(lethev1.PhasePending)
		}
		t.phases[phase]++
		if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionStalled) {
			t.stalled++
		}
		if noDeadline(er) {
			continue
		}
		d := t.byNS[er.Namespace]
		if d == nil {
			d = &namespaceDeadlines{}
			t.byNS[er.Namespace] = d
		}
		d.add(er)
	}
	return t
}

// noDeadline reports whether no deadline runs for the request: a dry run, a
// finished or cancelled one, or one without a deadline yet.
func noDeadline(er *lethev1.ErasureRequest) bool {
	// A dry run erases nothing, planned or not: no deadline runs for it.
	return er.Spec.DryRun || erasure.Terminal(er) || er.Status.Phase == lethev1.PhaseBackupsRotated ||
		meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionBackupsRotated) || er.Status.Deadline == nil
}

// add counts an unfinished request (with a deadline) in its namespace's
// deadlines: the earliest, the earliest with data still live, and whether
// its current step is projected late.
func (d *namespaceDeadlines) add(er *lethev1.ErasureRequest) {
	conds := er.Status.Conditions
	deadline := er.Status.Deadline.Time
	d.earliest = earlier(d.earliest, deadline)
	if !meta.IsStatusConditionTrue(conds, lethev1.ConditionGraphReconciled) {
		d.liveData = earlier(d.liveData, deadline)
	}
	if !meta.IsStatusConditionTrue(conds, lethev1.ConditionDeleted) {
		if er.Status.GraceEndsAt != nil && er.Status.GraceEndsAt.After(deadline) {
			d.lateDeletion++
		}
		return
	}
	// Deleted: what is left to wait for is the Backups' expiration.
	if latest, ok := latestRemainingExpiration(er); ok {
		if latest.After(d.backupsExpireBy) {
			d.backupsExpireBy = latest
		}
		if latest.After(deadline) {
			d.lateBackups++
		}
	}
}

// export sends the request gauges of a tally.
func (c *requestCollector) export(ch chan<- prometheus.Metric, t requestTally) {
	for p, n := range t.phases {
		ch <- prometheus.MustNewConstMetric(c.byPhase, prometheus.GaugeValue, n, p)
	}
	ch <- prometheus.MustNewConstMetric(c.stalled, prometheus.GaugeValue, t.stalled)
	for ns, d := range t.byNS {
		ch <- prometheus.MustNewConstMetric(c.earliestDeadline, prometheus.GaugeValue, unix(d.earliest), ns)
		if !d.liveData.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.liveDataDeadline, prometheus.GaugeValue, unix(d.liveData), ns)
		}
		if !d.backupsExpireBy.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.backupsExpireBy, prometheus.GaugeValue, unix(d.backupsExpireBy), ns)
		}
		// Both steps at every namespace with unfinished requests: 0 is a value
		// a rule can see, absent is not.
		ch <- prometheus.MustNewConstMetric(c.projectedLate, prometheus.GaugeValue, d.lateDeletion, ns, lethev1.ConditionDeleted)
		ch <- prometheus.MustNewConstMetric(c.projectedLate, prometheus.GaugeValue, d.lateBackups, ns, lethev1.ConditionBackupsRotated)
	}
}

// latestRemainingExpiration is the latest expiration among the request's
// recorded Backups that are not gone yet. A Backup Velero was asked to delete
// (immediate) goes now, whatever its expiration says.
func latestRemainingExpiration(er *lethev1.ErasureRequest) (time.Time, bool) {
	b, ok := lastToExpire(er)
	if !ok {
		return time.Time{}, false
	}
	return b.Expiration.Time, true
}

// lastToExpire is the recorded Backup, not gone and not asked to be
// deleted, whose expiration is the latest.
func lastToExpire(er *lethev1.ErasureRequest) (lethev1.BackupEvidence, bool) {
	var last lethev1.BackupEvidence
	found := false
	for _, b := range erasure.RecordedBackups(er) {
		if b.GoneAt != nil || b.DeleteBackupRequest != "" || b.Expiration == nil {
			continue
		}
		if !found || b.Expiration.After(last.Expiration.Time) {
			last, found = b, true
		}
	}
	return last, found
}

func unix(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }
