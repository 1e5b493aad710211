package erasurecli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A planning request is a dry-run ErasureRequest the plugin creates and
// deletes again. If the plugin is killed before it can delete it, these
// mark it for what it is: the label to find it, the annotation to say
// when it may be removed by anyone (the next plan run does so).
const (
	planLabel      = lethev1.LabelPlan
	planExpiresAt  = lethev1.AnnotationPlanExpiresAt
	managedByLabel = "app.kubernetes.io/managed-by"
	managedBy      = "kubectl-erasure"
)

// cleanupTimeout bounds the deletion of the planning request, which runs
// on a fresh context after the command's own is cancelled.
const cleanupTimeout = 15 * time.Second

type planOptions struct {
	*options
	spec    specFlags
	out     *outputFlags
	timeout time.Duration
}

func newPlan(o *options) *cobra.Command {
	p := &planOptions{options: o, out: newOutputFlags()}
	cmd := &cobra.Command{
		Use:   "plan [NAME] --store STORE --session-id ID [--session-id ID ...]",
		Short: "Show what an erasure would remove, counted by the database; changes nothing",
		Long: `Shows the plan of an erasure: the sessions found, the rows per table, embeddings,
cache entries, derived records, graph elements and backups it would remove. Nothing
is tombstoned or deleted.

The plan comes from a short-lived dry-run ErasureRequest (NAME-plan-xxxxx, NAME
"erasure" by default) that is deleted again, also on Ctrl-C or failure. It is
labelled ` + planLabel + `=true
and annotated with ` + planExpiresAt + `; should the plugin be killed before
removing it, the manager deletes it once expired (as does the next plan in the
namespace).`,
		Example: `  kubectl erasure plan --store memory --session-id 6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f
  kubectl erasure plan ticket-42 --store memory --session-ids-from ids.txt -o yaml`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "erasure"
			if len(args) == 1 {
				name = args[0]
			}
			return p.run(cmd.Context(), name)
		},
	}
	p.spec.addFlags(cmd.Flags())
	p.out.addFlags(cmd)
	cmd.Flags().DurationVar(&p.timeout, "timeout", time.Minute, "how long to wait for the plan")
	_ = cmd.RegisterFlagCompletionFunc("store", o.completeStores)
	return cmd
}

func (p *planOptions) run(ctx context.Context, name string) error {
	if p.timeout <= 0 {
		return errors.New("--timeout must be positive")
	}
	if err := p.out.validate(); err != nil {
		return err
	}
	ns, err := p.namespace()
	if err != nil {
		return err
	}
	er, err := p.spec.request(name, ns, p.streams.In, time.Now())
	if err != nil {
		return err
	}
	cl, _, err := p.client()
	if err != nil {
		return err
	}
	if err := cl.Create(ctx, er.DeepCopy(), client.DryRunAll); err != nil {
		return fmt.Errorf("the API server refuses the request: %w", err)
	}
	removeExpiredPlans(ctx, cl, ns, time.Now())
	planning := planningRequest(er, time.Now().Add(p.timeout+cleanupTimeout))
	// The name is chosen here, not by the server (generateName), so that
	// the clean-up knows it even when the create's answer never arrives.
	defer p.cleanup(ctx, cl, planning)
	if err := cl.Create(ctx, planning.DeepCopy()); err != nil {
		return err
	}
	done, err := waitFor(ctx, cl, ns, planning.Name, p.timeout, io.Discard)
	if err != nil {
		return fmt.Errorf("no plan: %w", err)
	}
	if p.out.human() {
		printPlan(p.streams.Out, done, p.out.isWide())
		fmt.Fprintln(p.streams.Out, "dry run: nothing was tombstoned or deleted, and the planning request was removed")
		return nil
	}
	return p.out.printObj(done, p.streams.Out)
}

// planningRequest is the dry-run copy of er under a fresh name, marked as
// the plugin's and with the time after which anyone may delete it.
func planningRequest(er *lethev1.ErasureRequest, expires time.Time) *lethev1.ErasureRequest {
	pr := er.DeepCopy()
	base := er.Name
	if max := 253 - len("-plan-xxxxx"); len(base) > max {
		base = base[:max]
	}
	pr.Name = base + "-plan-" + utilrand.String(5)
	pr.Labels = map[string]string{planLabel: "true", managedByLabel: managedBy}
	pr.Annotations = map[string]string{planExpiresAt: expires.UTC().Format(time.RFC3339)}
	pr.Spec.DryRun = true
	return pr
}

// cleanup deletes the planning request on a context of its own: the
// command's may be the one Ctrl-C cancelled.
func (p *planOptions) cleanup(ctx context.Context, cl client.Client, pr *lethev1.ErasureRequest) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := cl.Delete(ctx, pr)
	if err == nil || apierrors.IsNotFound(err) {
		return
	}
	fmt.Fprintf(p.streams.ErrOut, "Warning: could not remove the planning request %s: %v\n"+
		"  it changes nothing (dry run); remove it with: kubectl delete erasurerequest -n %s %s\n",
		pr.Name, err, pr.Namespace, pr.Name)
}

// removeExpiredPlans deletes planning requests left behind by a plugin
// that was killed, once their expiry has passed. Best effort: a user who
// may not list or delete them still gets a plan.
func removeExpiredPlans(ctx context.Context, cl client.Client, ns string, now time.Time) {
	list := &lethev1.ErasureRequestList{}
	if err := cl.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{planLabel: "true"}); err != nil {
		return
	}
	for i := range list.Items {
		er := &list.Items[i]
		if planExpired(er, now) {
			_ = cl.Delete(ctx, er)
		}
	}
}

// planExpired: only a dry-run request of the plugin's, past its expiry.
func planExpired(er *lethev1.ErasureRequest, now time.Time) bool {
	if !er.Spec.DryRun || er.Labels[planLabel] != "true" {
		return false
	}
	t, err := time.Parse(time.RFC3339, er.Annotations[planExpiresAt])
	return err == nil && now.After(t)
}

// printPlan is plan's table form.
func printPlan(out io.Writer, er *lethev1.ErasureRequest, wide bool) {
	p := er.Status.Plan
	if p == nil {
		fmt.Fprintln(out, "no plan")
		return
	}
	fmt.Fprintf(out, "Plan for %d session(s) in store %s:\n", len(er.Spec.SessionIDs), er.Spec.StoreRef.Name)
	fmt.Fprintf(out, "  sessions found: %d\n", p.SessionsFound)
	if len(p.NotFoundSessionIDs) > 0 {
		fmt.Fprintf(out, "  not found (never touched): %d\n", len(p.NotFoundSessionIDs))
		for _, id := range p.NotFoundSessionIDs {
			fmt.Fprintf(out, "    %s\n", id)
		}
	}
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Table", Type: "string"}, {Name: "Rows", Type: "integer"}}}
	for _, r := range p.Rows {
		t.Rows = append(t.Rows, metav1.TableRow{Cells: []any{r.Table, r.Rows}})
	}
	_ = printTable(&indent{w: out, prefix: "  "}, t, wide)
	fmt.Fprintf(out, "  embeddings: %d, content-keyed cache entries: %d, derived records: %d\n", p.Embeddings, p.ContentIndexEntries, p.DerivedRecords)
	fmt.Fprintf(out, "  graph: %d node(s), %d relationship(s); backups that may hold the data: %d\n", p.GraphNodes, p.GraphRelationships, p.Backups)
}
