package erasurecli

import (
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// steps are the step conditions in the order a request goes through them.
var steps = []string{lethev1.ConditionTombstoned, lethev1.ConditionGracePeriodElapsed, lethev1.ConditionDeleted,
	lethev1.ConditionGraphReconciled, lethev1.ConditionBackupsRotated}

// waitState is what a request waits for next: the condition that is not
// yet True, its reason and message, and until when the wait lasts when
// that is known (the grace period's end, the last backup's expiration).
type waitState struct {
	Condition string
	Status    metav1.ConditionStatus
	Reason    string
	Message   string
	Until     *metav1.Time
	// Human is set when the request is Stalled: it will not move until someone acts.
	Human bool
}

// nextWait says what the request waits for next, from its status alone;
// nil once it is in a terminal phase.
func nextWait(er *lethev1.ErasureRequest) *waitState {
	if er.Status.Phase.Final() {
		return nil
	}
	conds := er.Status.Conditions
	if c := meta.FindStatusCondition(conds, lethev1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue {
		return &waitState{Condition: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message, Human: true}
	}
	for _, step := range steps {
		c := meta.FindStatusCondition(conds, step)
		if c == nil {
			msg := "not started"
			if len(conds) == 0 {
				msg = "the Lethe manager has not picked the request up yet"
			}
			return &waitState{Condition: step, Status: metav1.ConditionUnknown, Message: msg}
		}
		if c.Status == metav1.ConditionTrue {
			continue
		}
		w := &waitState{Condition: step, Status: c.Status, Reason: c.Reason, Message: c.Message}
		switch step {
		case lethev1.ConditionGracePeriodElapsed:
			w.Until = er.Status.GraceEndsAt
		case lethev1.ConditionBackupsRotated:
			w.Until = lastExpiration(er)
		}
		return w
	}
	// Every step is done and the phase not yet written: the summary is next.
	return &waitState{Condition: lethev1.ConditionReady, Status: metav1.ConditionUnknown, Message: "the status is being summarised"}
}

// lastExpiration is the latest expiration among the backups not yet gone:
// when the BackupsRotated step can complete at the latest.
func lastExpiration(er *lethev1.ErasureRequest) *metav1.Time {
	if er.Status.Evidence == nil {
		return nil
	}
	var last *metav1.Time
	for _, s := range er.Status.Evidence.Steps {
		if s.Step != lethev1.ConditionBackupsRotated {
			continue
		}
		for _, b := range s.Backups {
			if b.GoneAt == nil && b.Expiration != nil && (last == nil || b.Expiration.After(last.Time)) {
				last = b.Expiration
			}
		}
	}
	return last
}

// progress is one line of --wait's output: the phase, what the request
// waits for, why, and until when.
func progress(er *lethev1.ErasureRequest, now time.Time) string {
	phase := er.Status.Phase
	if phase == "" {
		phase = lethev1.PhasePending
	}
	w := nextWait(er)
	if w == nil {
		return fmt.Sprintf("%s: phase %s", er.Name, phase)
	}
	line := fmt.Sprintf("%s: phase %s, waiting for %s", er.Name, phase, w.Condition)
	if w.Reason != "" {
		line += " (" + w.Reason + ")"
	}
	if w.Until != nil {
		line += " until " + timestamp(w.Until) + " (" + relative(w.Until.Time, now) + ")"
	}
	if w.Human {
		line += ": a human must act: " + w.Message
	}
	return line
}

// waitFor follows the request with a watch until it reaches a terminal
// phase or stalls, printing a progress line to out whenever what it waits
// for changes. It returns the request as last seen; the error is an
// *ExitError when the request failed, was cancelled, stalled or the
// timeout passed (0: no timeout).
func waitFor(parent context.Context, cl client.WithWatch, ns, name string, timeout time.Duration, out io.Writer) (*lethev1.ErasureRequest, error) {
	ctx, cancel := watchtools.ContextWithOptionalTimeout(parent, timeout)
	defer cancel()
	byName := client.MatchingFields{"metadata.name": name}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list := &lethev1.ErasureRequestList{}
			err := cl.List(ctx, list, client.InNamespace(ns), byName, &client.ListOptions{Raw: &opts}, client.Limit(opts.Limit), client.Continue(opts.Continue))
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return cl.Watch(ctx, &lethev1.ErasureRequestList{}, client.InNamespace(ns), byName, &client.ListOptions{Raw: &opts})
		},
	}
	var last *lethev1.ErasureRequest
	printed := ""
	_, err := watchtools.UntilWithSync(ctx, lw, &lethev1.ErasureRequest{}, nil, func(ev watch.Event) (bool, error) {
		er, ok := ev.Object.(*lethev1.ErasureRequest)
		if !ok {
			return false, nil
		}
		if ev.Type == watch.Deleted {
			return false, fmt.Errorf("erasurerequest %s was deleted while waiting (phase %s)", name, er.Status.Phase)
		}
		last = er
		// The line without its relative time, so that only a change of
		// state prints a new one.
		if key := progress(er, time.Time{}); key != printed {
			printed = key
			fmt.Fprintln(out, progress(er, time.Now()))
		}
		w := nextWait(er)
		return er.Status.Phase.Final() || (w != nil && w.Human), nil
	})
	if err != nil {
		if parent.Err() != nil {
			// Interrupted (Ctrl-C): the caller's context says why.
			return last, fmt.Errorf("stopped waiting: %w", context.Cause(parent))
		}
		if ctx.Err() != nil {
			state := "nothing seen yet"
			if last != nil {
				state = progress(last, time.Now())
			}
			return last, &ExitError{Code: 2, Err: fmt.Errorf("timed out after %s; last seen: %s", timeout, state)}
		}
		return last, err
	}
	return last, outcome(last)
}

// outcome turns the phase a wait ended in into the command's result.
func outcome(er *lethev1.ErasureRequest) error {
	switch er.Status.Phase {
	case lethev1.PhaseBackupsRotated, lethev1.PhasePlanned:
		return nil
	case lethev1.PhaseCancelled:
		return &ExitError{Code: 1, Err: fmt.Errorf("erasurerequest %s ended in phase %s", er.Name, er.Status.Phase)}
	}
	if w := nextWait(er); w != nil && w.Human {
		return &ExitError{Code: 1, Err: fmt.Errorf("erasurerequest %s is stalled (%s): a human must act: %s", er.Name, w.Reason, w.Message)}
	}
	return fmt.Errorf("erasurerequest %s: stopped waiting in phase %s", er.Name, er.Status.Phase)
}
