// Package metrics holds Lethe's Prometheus metrics, registered with
// controller-runtime's registry (served on the manager's metrics endpoint).
// Labels are low-cardinality: kinds, results and store names, never request
// or session IDs, never content.
package metrics

import (
	"regexp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// GraphPruned counts graph elements removed by the GraphReconciled step.
	GraphPruned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_graph_pruned_total",
		Help: "Graph nodes and relationships removed by the GraphReconciled step of erasure requests.",
	}, []string{"kind"})

	// GraphReappearedPruned counts graph elements of sessions erased by
	// requests whose object is gone, written after the erasure and pruned
	// by the store's audit.
	GraphReappearedPruned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_graph_reappeared_pruned_total",
		Help: "Graph nodes and relationships of sessions erased by requests whose object is gone, written after the erasure and pruned by the MemoryStore audit.",
	}, []string{"kind"})

	// GraphSweeps counts full graph reconciliations by result.
	GraphSweeps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_graph_sweeps_total",
		Help: "Full graph reconciliations from Postgres, by result (Completed, Refused, Failed).",
	}, []string{"result"})

	// RestoresDetected counts the audits that found a store's database
	// holding less erasure than its requests say (a restore).
	RestoresDetected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_memorystore_restores_detected_total",
		Help: "MemoryStore audits that found erased sessions back or erasure ledger rows gone (a restore of the database); the requests erase again.",
	}, []string{"namespace", "store"})

	// StoreLastAudit is when each store's audit last checked its erasures
	// against its database (restore detection): a store whose audits stop
	// (a lost requeue), whose database does not answer or whose check
	// fails detects no restore, and the age of this gauge shows it.
	StoreLastAudit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lethe_memorystore_last_audit_timestamp_seconds",
		Help: "Unix time of the last MemoryStore audit that checked the store's erasures against its database (restore detection), whatever it found.",
	}, []string{"namespace", "store"})

	// ErasuresUnderAnotherKey is how many requests hold keyed ledger rows
	// in each store's database under another erasure key than the one it
	// has now: the database matches none of those hashes (a restore into a
	// freshly migrated database). It does not heal by itself.
	ErasuresUnderAnotherKey = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lethe_memorystore_erasures_under_another_key",
		Help: "Requests whose erasure ledger rows in the MemoryStore's database are keyed hashes under another erasure key (lethe.erasure_key) than the database's now: their erased sources are no longer refused at ingestion.",
	}, []string{"namespace", "store"})

	// RecordEntriesMended counts the erasures a store's audit wrote again
	// into its record from the ledger: no record in the cluster held them
	// (a record part deleted or edited, a record write lost).
	RecordEntriesMended = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_erasure_record_entries_mended_total",
		Help: "Erasures of gone requests that the MemoryStore's ledger holds and no erasure record in the cluster did, written again into the store's record by its audit.",
	}, []string{"namespace", "store"})

	// GraphSweepRemoved counts graph elements removed by sweeps.
	GraphSweepRemoved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_graph_sweep_removed_total",
		Help: "Graph nodes and relationships removed by full reconciliations because their provenance no longer exists in Postgres.",
	}, []string{"kind"})

	// GraphSweepLastCompletion is when each store's last sweep completed.
	GraphSweepLastCompletion = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lethe_graph_sweep_last_completion_timestamp_seconds",
		Help: "Unix time of the last completed full graph reconciliation, per MemoryStore.",
	}, []string{"namespace", "store"})

	// GraphProvenanceless is what each store's last completed sweep left in
	// the graph without provenance, by kind (nodes, relationships).
	GraphProvenanceless = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lethe_graph_provenanceless_elements",
		Help: "Graph nodes and relationships without provenance (no session or fact ID to check against Postgres) left by the last completed full reconciliation, per MemoryStore: attached to live data, they are kept, but nothing attests them.",
	}, []string{"namespace", "store", "kind"})

	// GraphSweepDuration is how long sweeps take.
	GraphSweepDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lethe_graph_sweep_duration_seconds",
		Help:    "Duration of full graph reconciliations.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
	})
)

var (
	// StepDuration is the time from one milestone of a request to the next.
	StepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lethe_erasure_step_duration_seconds",
		Help:    "Time from a request's previous milestone to this one, by the milestone reached.",
		Buckets: []float64{0.1, 1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400},
	}, []string{"phase"})

	// RowsDeleted counts rows removed by the Deleted step, by table.
	RowsDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_erasure_rows_deleted_total",
		Help: "Rows removed by erasures, by schema-qualified table (the cascade included).",
	}, []string{"table"})

	// TombstoneReaper counts sessions deleted after their tombstone's grace
	// period, the decision record's memory-tombstone-reaper counter.
	TombstoneReaper = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_tombstone_reaper_sessions_deleted_total",
		Help: "Tombstoned sessions hard-deleted, by how (grace: after the grace period; immediate).",
	}, []string{"mode"})

	// TombstoneReaperRows is the decision record's own counter, kept under
	// its name for the dashboards and alerts built on it: tombstoned
	// sessions hard-deleted, by the Deleted step or by the store's reaper
	// of tombstones whose request is gone.
	TombstoneReaperRows = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memory_tombstone_reaper_rows_deleted_total",
		Help: "Tombstoned sessions hard-deleted (the decision record's memory-tombstone-reaper counter; Lethe's Deleted step and its reaper of tombstones whose request is gone).",
	})

	// TombstonedSessions is how many sessions each store holds tombstoned.
	TombstonedSessions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lethe_tombstoned_sessions",
		Help: "Sessions tombstoned (hidden, not yet deleted) in each MemoryStore's database, for its tenant, at its last audit.",
	}, []string{"namespace", "store"})

	// TombstoneOverdue is how long the oldest tombstone in force of each
	// store has outlived its grace period.
	TombstoneOverdue = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lethe_tombstone_overdue_seconds",
		Help: "How long the oldest tombstone still in force (not erased, not cancelled) in each MemoryStore's database has outlived its grace period, at its last audit; 0 when none has.",
	}, []string{"namespace", "store"})

	// TombstonesReaped counts the tombstones the store's reaper ended
	// because their request was gone, by how (lifted, deleted).
	TombstonesReaped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_tombstones_reaped_total",
		Help: "Tombstoned sessions whose ErasureRequest was gone, ended by the MemoryStore's reaper: lifted (the deletion had not started) or deleted (it had).",
	}, []string{"namespace", "store", "action"})

	// BackupWork counts Velero changes, by kind (shortened, delete_requested).
	BackupWork = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_backups_changed_total",
		Help: "Velero Backups made to expire by erasures: expiration shortened or DeleteBackupRequest created.",
	}, []string{"action"})
)

// Collectors are this package's metrics, all registered with
// controller-runtime's registry at start.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{GraphPruned, GraphReappearedPruned, GraphSweeps, GraphSweepRemoved, GraphSweepLastCompletion, GraphProvenanceless, GraphSweepDuration,
		StepDuration, RowsDeleted, TombstoneReaper, TombstoneReaperRows, TombstonedSessions, TombstoneOverdue, TombstonesReaped, BackupWork, RestoresDetected, StoreLastAudit,
		ErasuresUnderAnotherKey, RecordEntriesMended}
}

func init() {
	crmetrics.Registry.MustRegister(Collectors()...)
}

// client_golang's Desc has no name accessor; its String form has been
// `Desc{fqName: "NAME", ...}` since its first release.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names returns the metric names the collectors describe, sorted: what a
// rule or a dashboard may query (histograms add _bucket, _sum and _count).
// A vector with no child yet is described all the same, unlike Gather.
func Names(cs ...prometheus.Collector) []string {
	var names []string
	for _, c := range cs {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names = append(names, m[1])
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}
