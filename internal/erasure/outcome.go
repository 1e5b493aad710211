package erasure

import (
	"errors"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Kind says what a step's outcome means for the pass.
type Kind int

const (
	// Done: the step's work is complete; the next step runs.
	Done Kind = iota
	// Waiting: not done; the request moves on by itself (a grace period, a
	// replica, a Backup's expiration); looked at again after RequeueAfter.
	Waiting
	// Stalled: not done; a human must act (the condition says what);
	// looked at again after RequeueAfter, never in a hot loop.
	Stalled
	// Ended: the request ended without completing (planned, cancelled);
	// nothing more happens to it.
	Ended
	// Errored: not done; Err goes to controller-runtime, which retries with
	// backoff. The condition's message stays stable; the error is logged.
	Errored
)

// Condition is a step condition an outcome sets.
type Condition struct {
	Type string
	OK   bool
	// Reason is a CamelCase constant of the API.
	Reason string
	// Message is stable between passes: no error text, no counts, no times.
	Message string
}

// Milestone is a history entry an outcome appends (and the event the
// controller emits with it).
type Milestone struct {
	Phase lethev1.Phase
	// Event names a notable way the phase was reached (Immediate,
	// Resurrected, NotConfigured…); empty for the plain milestone.
	Event string
	// At is the database's clock where it was read, else the manager's.
	At time.Time
	// Evidence is digested into the entry.
	Evidence any
	// Note is the event's text: counts and names only.
	Note string
}

// Warning is a Warning event an outcome asks for.
type Warning struct {
	Reason, Action, Note string
}

// Work is what a pass did, for the metrics.
type Work struct {
	// SessionsDeleted by the deletion, in mode "grace" or "immediate".
	SessionsDeleted int
	Mode            string
	RowsDeleted     []lethev1.TableCount
	GraphPruned     GraphCounts
	Backups         []Backup
}

// Outcome is everything one step's pass produced. The controller applies
// it in one place: it is the only writer of step conditions, evidence,
// history entries, events and metrics.
type Outcome struct {
	Kind      Kind
	Condition *Condition
	// Plan and GraceEndsAt, when set, replace the status fields.
	Plan        *lethev1.ErasurePlan
	GraceEndsAt *time.Time
	// Evidence replaces the evidence entry of its step.
	Evidence  *lethev1.StepEvidence
	Milestone *Milestone
	Warning   *Warning
	Work      Work
	// RequeueAfter is when to look again (Waiting, Stalled, or a completed
	// request's next re-verification); on a Done step, the latest the
	// request is looked at again while the later steps go on.
	RequeueAfter time.Duration
	// Wake, when set, is closed when the work the step waits on (outside
	// the pass) has ended: the request gets a pass then. A step returns it
	// once per wait, so that one wait brings one pass.
	Wake <-chan struct{}
	// Err is the error behind an Errored outcome; never copied into a message.
	Err error
	// Persisted, when set, is called once the status this outcome was
	// recorded into has been written. Until then the step keeps what it
	// needs to give the same outcome again, so that a pass whose write was
	// refused (a conflict) is followed by one that need not redo the work.
	Persisted func()
}

// IsDone reports whether the next step may run.
func (o Outcome) IsDone() bool { return o.Kind == Done }

func condition(t string, ok bool, reason, message string) *Condition {
	return &Condition{Type: t, OK: ok, Reason: reason, Message: message}
}

func done(t, reason, message string) Outcome {
	return Outcome{Kind: Done, Condition: condition(t, true, reason, message)}
}

func waiting(after time.Duration, t, reason, message string) Outcome {
	return Outcome{Kind: Waiting, Condition: condition(t, false, reason, message), RequeueAfter: after}
}

func stalled(after time.Duration, t, reason, message string) Outcome {
	return Outcome{Kind: Stalled, Condition: condition(t, false, reason, message), RequeueAfter: after}
}

// failed turns a port's error into the step's outcome: a configuration a
// human must fix waits with its own stable reason and message (it is not
// the controller's error); anything else is returned to controller-runtime
// with the stable message given.
func failed(cfg Config, t, reason, message string, err error) Outcome {
	var ce *ConfigError
	if errors.As(err, &ce) {
		return waiting(cfg.RetryAfter, t, ce.Reason, ce.Message)
	}
	return Outcome{Kind: Errored, Condition: condition(t, false, reason, message), Err: err}
}

// errored is an error that changes no condition (the step's condition
// already says where it is).
func errored(err error) Outcome { return Outcome{Kind: Errored, Err: err} }
