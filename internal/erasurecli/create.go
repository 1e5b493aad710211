package erasurecli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// The API's own rules, checked here first so that a typo is reported
// before anything reaches the cluster.
var sessionID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

type createOptions struct {
	*options
	store     string
	ids       []string
	idsFile   string
	immediate bool
	reason    string
	grace     time.Duration
	dryRun    bool
	timeout   time.Duration
}

func newCreate(o *options) *cobra.Command {
	c := &createOptions{options: o}
	cmd := &cobra.Command{
		Use:   "create NAME --store STORE --session-id ID [--session-id ID ...]",
		Short: "Request the erasure of sessions (memory-forget)",
		Long: `Creates an ErasureRequest. The sessions are tombstoned at once and deleted when the
grace period (default 168h) ends; --immediate (with --reason) skips the grace period.
--dry-run shows the plan (what would be deleted, counted by the database) and
leaves nothing behind: the plan comes from a dry-run request that is removed again.`,
		Example: `  kubectl erasure create forget-ticket-42 --store memory --session-id 6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f
  kubectl erasure create forget-ticket-43 --store memory --session-ids-from ids.txt --immediate --reason "DPO-1142"
  kubectl erasure create preview --store memory --session-id 6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f --dry-run`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return c.run(cmd.Context(), args[0]) },
	}
	f := cmd.Flags()
	f.StringVar(&c.store, "store", "", "the MemoryStore in the request's namespace (required)")
	f.StringArrayVar(&c.ids, "session-id", nil, "a session to erase (repeatable)")
	f.StringVar(&c.idsFile, "session-ids-from", "", "a file with one session ID per line ('-' for standard input)")
	f.BoolVar(&c.immediate, "immediate", false, "skip the grace period (needs --reason)")
	f.StringVar(&c.reason, "reason", "", "why the grace period is skipped (e.g. a ticket)")
	f.DurationVar(&c.grace, "grace", 0, "grace period before deletion (default 168h, the API's default)")
	f.BoolVar(&c.dryRun, "dry-run", false, "show the plan and create nothing")
	f.DurationVar(&c.timeout, "timeout", time.Minute, "how long --dry-run waits for the plan")
	return cmd
}

// request validates the flags and builds the ErasureRequest.
func (c *createOptions) request(name, ns string) (*lethev1.ErasureRequest, error) {
	ids := append([]string(nil), c.ids...)
	if c.idsFile != "" {
		more, err := readIDs(c.idsFile, c.streams.In)
		if err != nil {
			return nil, err
		}
		ids = append(ids, more...)
	}
	var problems []string
	if c.store == "" {
		problems = append(problems, "--store is required")
	}
	if len(ids) == 0 {
		problems = append(problems, "at least one --session-id (or --session-ids-from) is required")
	}
	if len(ids) > 1000 {
		problems = append(problems, fmt.Sprintf("%d session IDs: at most 1000 per request", len(ids)))
	}
	seen := map[string]bool{}
	for _, id := range ids {
		switch {
		case !sessionID.MatchString(id):
			problems = append(problems, fmt.Sprintf("%q is not a lowercase canonical UUID", id))
		case seen[id]:
			problems = append(problems, fmt.Sprintf("session %s is listed twice", id))
		}
		seen[id] = true
	}
	if c.immediate && strings.TrimSpace(c.reason) == "" {
		problems = append(problems, "--immediate needs --reason")
	}
	if c.immediate && c.grace != 0 {
		problems = append(problems, "--immediate and --grace exclude each other")
	}
	if c.grace < 0 {
		problems = append(problems, "--grace must not be negative")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("invalid request:\n  %s", strings.Join(problems, "\n  "))
	}
	er := &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: c.store},
			Immediate: c.immediate, Reason: c.reason, DryRun: c.dryRun},
	}
	for _, id := range ids {
		er.Spec.SessionIDs = append(er.Spec.SessionIDs, lethev1.SessionID(id))
	}
	if c.grace > 0 {
		er.Spec.GracePeriod = &metav1.Duration{Duration: c.grace}
	}
	return er, nil
}

func (c *createOptions) run(ctx context.Context, name string) error {
	ns, _, err := c.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return err
	}
	// Bad input is reported before anything talks to the cluster.
	er, err := c.request(name, ns)
	if err != nil {
		return err
	}
	cl, _, err := c.client()
	if err != nil {
		return err
	}
	// The API server's admission rules, without creating anything.
	if err := cl.Create(ctx, er.DeepCopy(), client.DryRunAll); err != nil {
		return fmt.Errorf("the API server refuses the request: %w", err)
	}
	if !c.dryRun {
		if err := cl.Create(ctx, er); err != nil {
			return err
		}
		fmt.Fprintf(c.streams.Out, "erasurerequest %s/%s created (%d session(s), store %s)\n", ns, name, len(er.Spec.SessionIDs), c.store)
		return nil
	}
	return c.plan(ctx, cl, er)
}

// plan creates a dry-run request under a generated name, waits for its
// plan, prints it and removes the request again.
func (c *createOptions) plan(ctx context.Context, cl client.Client, er *lethev1.ErasureRequest) error {
	er.GenerateName, er.Name = er.Name+"-plan-", ""
	if err := cl.Create(ctx, er); err != nil {
		return err
	}
	defer func() { _ = cl.Delete(context.WithoutCancel(ctx), er) }()
	deadline := time.Now().Add(c.timeout)
	for er.Status.Phase != lethev1.PhasePlanned {
		if time.Now().After(deadline) {
			return fmt.Errorf("no plan after %s (is the Lethe manager running?); conditions: %s", c.timeout, conditions(er))
		}
		time.Sleep(300 * time.Millisecond)
		if err := cl.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
	}
	printPlan(c.streams.Out, er)
	fmt.Fprintln(c.streams.Out, "dry run: nothing was tombstoned or deleted, and the dry-run request was removed")
	return nil
}

func printPlan(out io.Writer, er *lethev1.ErasureRequest) {
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
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  TABLE\tROWS")
	for _, r := range p.Rows {
		fmt.Fprintf(w, "  %s\t%d\n", r.Table, r.Rows)
	}
	_ = w.Flush()
	fmt.Fprintf(out, "  embeddings: %d, content-keyed cache entries: %d, derived records: %d\n", p.Embeddings, p.ContentIndexEntries, p.DerivedRecords)
}

func conditions(er *lethev1.ErasureRequest) string {
	var parts []string
	for _, c := range er.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	if len(parts) == 0 {
		return "none yet"
	}
	return strings.Join(parts, " ")
}

func readIDs(path string, stdin io.Reader) ([]string, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	var ids []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ids = append(ids, line)
	}
	return ids, sc.Err()
}
