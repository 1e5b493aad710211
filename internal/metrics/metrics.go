// Package metrics holds Lethe's Prometheus metrics, registered with
// controller-runtime's registry (served on the manager's metrics endpoint).
// Labels are low-cardinality: kinds, results and store names, never request
// or session IDs, never content.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// GraphPruned counts graph elements removed by the GraphReconciled step.
	GraphPruned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_graph_pruned_total",
		Help: "Graph nodes and relationships removed by the GraphReconciled step of erasure requests.",
	}, []string{"kind"})

	// GraphSweeps counts full graph reconciliations by result.
	GraphSweeps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lethe_graph_sweeps_total",
		Help: "Full graph reconciliations from Postgres, by result (Completed, Refused, Failed).",
	}, []string{"result"})

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

	// GraphSweepDuration is how long sweeps take.
	GraphSweepDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lethe_graph_sweep_duration_seconds",
		Help:    "Duration of full graph reconciliations.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
	})
)

func init() {
	crmetrics.Registry.MustRegister(GraphPruned, GraphSweeps, GraphSweepRemoved, GraphSweepLastCompletion, GraphSweepDuration)
}
