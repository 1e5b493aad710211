package erasure

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Config bounds the work of one pass.
type Config struct {
	// BatchSize bounds the sessions deleted per transaction.
	BatchSize int
	// ProbeBudget bounds the erased embeddings the residue probe queries per
	// request, and the passages of erased text the text probe looks for (at
	// most TextProbeBudget).
	ProbeBudget int
	// GraphBatch bounds the erased sessions one graph prune (and receipt) covers.
	GraphBatch int
	// GraphDeleteLimit bounds the graph elements one delete query removes.
	GraphDeleteLimit int
	// GraphTimeout bounds the graph work of one pass.
	GraphTimeout time.Duration
	// RetryAfter is the wait after a missing store or a configuration a human must fix.
	RetryAfter time.Duration
	// BackupRecheck bounds the wait between checks of Backups still expiring.
	BackupRecheck time.Duration
	// ReverifyInterval is how often a completed request is checked again.
	ReverifyInterval time.Duration
	// ReplicaRecheck is the wait for a replica to catch up.
	ReplicaRecheck time.Duration
	// MinGracePeriod is the shortest grace period a request that is not
	// immediate may have.
	MinGracePeriod time.Duration
}

// Scope is what one pass works on.
type Scope struct {
	// Request is the request as read at the start of the pass, with the
	// outcomes of this pass's earlier steps applied. Steps only read it.
	Request *lethev1.ErasureRequest
	// Store is the request's MemoryStore.
	Store *lethev1.MemoryStore
	Ports
}

func (s *Scope) uid() string { return string(s.Request.UID) }

func (s *Scope) isTrue(condType string) bool {
	return meta.IsStatusConditionTrue(s.Request.Status.Conditions, condType)
}

func (s *Scope) reason(condType string) string {
	if c := meta.FindStatusCondition(s.Request.Status.Conditions, condType); c != nil {
		return c.Reason
	}
	return ""
}

// LedgerRequest is the database's view of the erasure request.
func LedgerRequest(er *lethev1.ErasureRequest) Request {
	ids := make([]string, len(er.Spec.SessionIDs))
	for i, id := range er.Spec.SessionIDs {
		ids[i] = string(id)
	}
	grace := lethev1.DefaultGracePeriod
	switch {
	case er.Spec.Immediate:
		grace = 0
	case er.Spec.GracePeriod != nil:
		grace = er.Spec.GracePeriod.Duration
	}
	return Request{UID: string(er.UID), SessionIDs: ids, Grace: grace}
}

// FoundRequest is the request as far as the sessions it found go: the
// requested sessions less those the plan did not find for the tenant. It is
// kept by the API server, so it survives a restore of the memory database.
func FoundRequest(er *lethev1.ErasureRequest) Request {
	req := LedgerRequest(er)
	req.Grace = 0
	if er.Status.Plan == nil {
		return req
	}
	notFound := map[string]bool{}
	for _, id := range er.Status.Plan.NotFoundSessionIDs {
		notFound[string(id)] = true
	}
	found := req.SessionIDs[:0:0]
	for _, id := range req.SessionIDs {
		if !notFound[id] {
			found = append(found, id)
		}
	}
	req.SessionIDs = found
	return req
}

// Step is one step of the phase machine. Run is idempotent: it returns
// Done at once when its condition is already True, and running it again
// after a crash anywhere gives the same end state and evidence.
type Step interface {
	// Name is the step's condition type.
	Name() string
	Run(ctx context.Context, s *Scope) Outcome
}

// Reverifier checks a completed step again with the step's own code: what
// came back is removed again and recorded, and the step's condition is
// never changed.
type Reverifier interface {
	Reverify(ctx context.Context, s *Scope) Outcome
}

// Machine is the ordered list of steps, stopping at the first not done.
type Machine struct {
	Config Config
	delete *Deletion
	steps  []Step
	checks []Reverifier
}

// NewMachine returns the phase machine: tombstone, grace, delete, graph, backups.
func NewMachine(cfg Config) *Machine {
	w := &ReplicaWaits{}
	d := &Deletion{Config: cfg, Waits: w}
	g := GraphPrune{Config: cfg}
	b := BackupRotation{Config: cfg}
	return &Machine{
		Config: cfg,
		delete: d,
		steps:  []Step{Tombstoning{Config: cfg, Waits: w}, GraceWait{Config: cfg, Waits: w}, d, g, b},
		// The deletion's own check runs as its step on every pass after it.
		checks: []Reverifier{g, b},
	}
}

// Steps are the steps in order.
func (m *Machine) Steps() []Step { return m.steps }

// Reverifiers are the checks of a completed request, in order.
func (m *Machine) Reverifiers() []Reverifier { return m.checks }

// Forget drops what the machine keeps in memory for a deleted request (the
// probe sample, the replica waits).
func (m *Machine) Forget(uid string) { m.delete.forgetAll(uid) }
