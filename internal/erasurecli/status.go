package erasurecli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/spf13/cobra"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// recentEvents is how many of the request's events status shows.
const recentEvents = 10

func newStatus(o *options) *cobra.Command {
	out := newOutputFlags()
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a request's state: conditions, what it waits for next, plan, evidence, recent events",
		Long: `Describes one ErasureRequest the way "cmctl status certificate" does: its phase and
deadline, every condition with its reason and message, what it waits for next and
until when, the plan, the evidence each step recorded, its history's head and
receipt, and its recent events. -o yaml or -o json print the object itself.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeRequests,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			cl, er, err := o.get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !out.human() {
				return out.printObj(er, o.streams.Out)
			}
			events, evErr := requestEvents(cmd.Context(), cl, er)
			describe(o.streams.Out, er, events, evErr, out.isWide(), time.Now())
			return nil
		},
	}
	out.addFlags(cmd)
	return cmd
}

// requestEvents lists the events about the request (events.k8s.io/v1,
// matched by the object's UID).
func requestEvents(ctx context.Context, cl client.Client, er *lethev1.ErasureRequest) ([]eventsv1.Event, error) {
	list := &eventsv1.EventList{}
	if err := cl.List(ctx, list, client.InNamespace(er.Namespace), client.MatchingFields{"regarding.uid": string(er.UID)}); err != nil {
		return nil, err
	}
	var evs []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.UID == er.UID {
			evs = append(evs, e)
		}
	}
	return evs, nil
}

// eventTime is when an event last happened.
func eventTime(e eventsv1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.DeprecatedLastTimestamp.IsZero():
		return e.DeprecatedLastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// describe is status's human form. It prints counts, reasons, times and
// digests; never the request's free-text reason.
func describe(out io.Writer, er *lethev1.ErasureRequest, events []eventsv1.Event, evErr error, wide bool, now time.Time) {
	describeHeader(out, er, now)
	describeConditions(out, er.Status.Conditions, wide, now)
	describePlan(out, er)
	describeEvidence(out, er.Status.Evidence, wide)
	describeHistory(out, er, wide)
	describeEvents(out, events, evErr, wide, now)
}

// describeHeader prints the request's key-value lines, from its name to
// what it waits for next, aligned in two columns.
func describeHeader(out io.Writer, er *lethev1.ErasureRequest, now time.Time) {
	st := &er.Status
	kv := printers.GetNewTabWriter(out)
	phase := st.Phase
	if phase == "" {
		phase = lethev1.PhasePending
	}
	line := func(k, format string, a ...any) {
		if k != "" {
			k += ":"
		}
		fmt.Fprintf(kv, "%s\t"+format+"\n", append([]any{k}, a...)...)
	}
	line("Name", "%s", er.Name)
	line("Namespace", "%s", er.Namespace)
	line("Created", "%s (%s)", timestamp(&er.CreationTimestamp), relative(er.CreationTimestamp.Time, now))
	line("Store", "%s", er.Spec.StoreRef.Name)
	line("Sessions", "%d", len(er.Spec.SessionIDs))
	line("Mode", "%s", mode(&er.Spec))
	if er.Spec.Cancel {
		line("Cancel", "requested")
	}
	if er.Spec.RequestedAt != nil {
		line("Requested at", "%s", timestamp(er.Spec.RequestedAt))
	}
	if st.Deadline != nil {
		line("Deadline", "%s (%s)", timestamp(st.Deadline), relative(st.Deadline.Time, now))
	}
	if st.GraceEndsAt != nil {
		line("Grace ends", "%s (%s)", timestamp(st.GraceEndsAt), relative(st.GraceEndsAt.Time, now))
	}
	line("Phase", "%s", phase)
	if w := nextWait(er); w != nil {
		line("Waiting for", "%s", waitingFor(w, now))
		if w.Message != "" {
			line("", "%s", w.Message)
		}
	} else {
		line("Waiting for", "nothing: the request is in a final phase")
	}
	_ = kv.Flush()
}

// mode says how the request erases: a dry run, immediately, or after its
// grace period.
func mode(spec *lethev1.ErasureRequestSpec) string {
	switch {
	case spec.DryRun:
		return "dry run (plan only)"
	case spec.Immediate:
		return "immediate: no grace period (a reason is recorded in spec.reason)"
	}
	grace := "168h (default)"
	if spec.GracePeriod != nil {
		grace = shortDuration(spec.GracePeriod.Duration)
	}
	return "grace period " + grace
}

// waitingFor is the "Waiting for" line of what the request waits for next:
// the condition, its status and reason, until when, and whether a human must
// act.
func waitingFor(w *waitState, now time.Time) string {
	s := fmt.Sprintf("%s (status %s", w.Condition, w.Status)
	if w.Reason != "" {
		s += ", reason " + w.Reason
	}
	s += ")"
	if w.Until != nil {
		s += " until " + timestamp(w.Until) + " (" + relative(w.Until.Time, now) + ")"
	}
	if w.Human {
		s += ": a human must act"
	}
	return s
}

// describeConditions prints the Conditions section: one row per condition.
func describeConditions(out io.Writer, conditions []metav1.Condition, wide bool, now time.Time) {
	section(out, "Conditions")
	conds := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Type", Type: "string"}, {Name: "Status", Type: "string"}, {Name: "Reason", Type: "string"},
		{Name: "Since", Type: "string"}, {Name: "Message", Type: "string"}}}
	for _, c := range conditions {
		conds.Rows = append(conds.Rows, metav1.TableRow{Cells: []any{c.Type, string(c.Status), dash(c.Reason), age(c.LastTransitionTime, now), dash(c.Message)}})
	}
	table(out, conds, wide, "none yet")
}

// describePlan prints the Plan section: what the plan found, by layer.
func describePlan(out io.Writer, er *lethev1.ErasureRequest) {
	section(out, "Plan")
	p := er.Status.Plan
	if p == nil {
		fmt.Fprintln(out, "  none yet")
		return
	}
	var rows int64
	for _, r := range p.Rows {
		rows += r.Rows
	}
	fmt.Fprintf(out, "  sessions found %d of %d (not found, never touched: %d); taken %s\n", p.SessionsFound, len(er.Spec.SessionIDs), len(p.NotFoundSessionIDs), timestamp(p.PlannedAt))
	fmt.Fprintf(out, "  %d row(s) in %d table(s), %d embedding(s), %d content-keyed cache entr(ies), %d derived record(s)\n", rows, len(p.Rows), p.Embeddings, p.ContentIndexEntries, p.DerivedRecords)
	fmt.Fprintf(out, "  graph: %d node(s), %d relationship(s); backups that may hold the data: %d\n", p.GraphNodes, p.GraphRelationships, p.Backups)
}

// describeEvidence prints the Evidence section: one row per recorded step.
func describeEvidence(out io.Writer, rec *lethev1.ErasureEvidence, wide bool) {
	section(out, "Evidence")
	ev := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Step", Type: "string"}, {Name: "Started", Type: "string"}, {Name: "Completed", Type: "string"},
		{Name: "Took", Type: "string"}, {Name: "Removed", Type: "integer"}, {Name: "Checks", Type: "string"},
		{Name: "Backups", Type: "integer"}, {Name: "Note", Type: "string", Priority: 1}}}
	if rec != nil {
		for _, s := range rec.Steps {
			ev.Rows = append(ev.Rows, metav1.TableRow{Cells: stepCells(s)})
		}
	}
	table(out, ev, wide, "none yet")
}

// describeHistory prints the History section: the hash chain's length, head
// and verdict, and the receipt over it.
func describeHistory(out io.Writer, er *lethev1.ErasureRequest, wide bool) {
	st := &er.Status
	section(out, "History")
	if n := len(st.History); n > 0 {
		verdict := "hash chain verifies"
		if err := evidence.VerifyChain(evidence.ChainOf(er)); err != nil {
			verdict = "hash chain does NOT verify: " + err.Error()
		}
		fmt.Fprintf(out, "  %d entr(ies), head %s; %s\n", n, digest(st.History[n-1].Digest, wide), verdict)
	} else {
		fmt.Fprintln(out, "  no entries yet")
	}
	if r := st.Receipt; r != nil {
		signed := "unsigned"
		if r.Envelope != "" {
			signed = "signed with key " + digest(r.KeyID, wide)
		}
		fmt.Fprintf(out, "  receipt over %s, %s, issued %s\n", digest(r.Digest, wide), signed, timestamp(r.IssuedAt))
	}
}

// describeEvents prints the Events section: the most recent events, oldest
// first, or why they could not be listed.
func describeEvents(out io.Writer, events []eventsv1.Event, evErr error, wide bool, now time.Time) {
	section(out, "Events")
	if evErr != nil {
		fmt.Fprintf(out, "  cannot list events: %v\n", evErr)
		return
	}
	events = slices.Clone(events)
	sort.SliceStable(events, func(i, j int) bool { return eventTime(events[i]).Before(eventTime(events[j])) })
	if len(events) > recentEvents {
		events = events[len(events)-recentEvents:]
	}
	et := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Type", Type: "string"}, {Name: "Reason", Type: "string"}, {Name: "Age", Type: "string"},
		{Name: "From", Type: "string"}, {Name: "Message", Type: "string"}}}
	for _, e := range events {
		count := ""
		if e.Series != nil && e.Series.Count > 1 {
			count = fmt.Sprintf(" (x%d)", e.Series.Count)
		}
		et.Rows = append(et.Rows, metav1.TableRow{Cells: []any{e.Type, e.Reason, age(metav1.Time{Time: eventTime(e)}, now) + count, dash(e.ReportingController), e.Note}})
	}
	table(out, et, wide, "none")
}

// stepCells is one step's evidence row: when, how long, how much was
// removed, how many checks found nothing.
func stepCells(s lethev1.StepEvidence) []any {
	took := "-"
	if s.StartedAt != nil && s.CompletedAt != nil {
		took = s.CompletedAt.Sub(s.StartedAt.Time).Round(time.Millisecond).String()
	}
	var removed int64
	for _, c := range s.Counts {
		removed += c.Rows
	}
	absent := 0
	for _, v := range s.Verification {
		if v.Found == 0 {
			absent++
		}
	}
	checks := "-"
	if len(s.Verification) > 0 {
		checks = fmt.Sprintf("%d/%d absent", absent, len(s.Verification))
	}
	return []any{s.Step, timestamp(s.StartedAt), timestamp(s.CompletedAt), took, removed, checks, len(s.Backups), dash(s.Note)}
}

func section(out io.Writer, title string) { fmt.Fprintf(out, "%s:\n", title) }

// table prints an indented table, or a line saying there is nothing.
func table(out io.Writer, t *metav1.Table, wide bool, none string) {
	if len(t.Rows) == 0 {
		fmt.Fprintf(out, "  %s\n", none)
		return
	}
	_ = printTable(&indent{w: out, prefix: "  "}, t, wide)
}
