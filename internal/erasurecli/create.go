package erasurecli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

type createOptions struct {
	*options
	spec    specFlags
	out     *outputFlags
	export  bool
	wait    bool
	timeout time.Duration
	dryRun  bool
}

func newCreate(o *options) *cobra.Command {
	c := &createOptions{options: o, out: newOutputFlags()}
	cmd := &cobra.Command{
		Use:   "create NAME --store STORE --session-id ID [--session-id ID ...]",
		Short: "Request the erasure of sessions (memory-forget), or --export its manifest",
		Long: `Creates an ErasureRequest. The sessions are tombstoned at once and deleted when the
grace period (default 168h) ends; --immediate (with --reason) skips the grace period.
The one-month deadline runs from --requested-at (when the data subject asked;
default: now).

--export prints the manifest instead of creating it (YAML, or -o json), for Git:
no status, no server fields; the namespace only when -n is given. It is checked
exactly like create, without a cluster.

--wait follows the request until it is done, printing what it waits for and until
when. Exit status: 0 when every step is done (BackupsRotated), 1 when it failed,
was cancelled or is stalled on a human, 2 when --timeout passed first.

To see what a request would erase without creating one, use "kubectl erasure plan".`,
		Example: `  kubectl erasure create forget-ticket-42 --store memory --session-id 6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f
  kubectl erasure create forget-ticket-43 --store memory --session-ids-from ids.txt --immediate --reason "DPO-1142" --wait
  kubectl erasure create forget-ticket-44 -n apps --store memory --session-id 6f1c2a4e-8b3d-4f5a-9c7e-1d2b3a4c5e6f \
      --requested-at 2026-11-02T09:30:00Z --export > erasures/forget-ticket-44.yaml`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, args []string) error { return c.run(cmd, args[0]) },
	}
	f := cmd.Flags()
	c.spec.addFlags(f)
	c.out.addFlags(cmd)
	f.BoolVar(&c.export, "export", false, "print the manifest (YAML; -o json) instead of creating the request")
	f.BoolVar(&c.wait, "wait", false, "follow the request until it is done, failed, cancelled or stalled")
	f.DurationVar(&c.timeout, "timeout", 10*time.Minute, "how long --wait waits (0: no limit)")
	// kubectl's --dry-run means "send it, persist nothing"; ours used to
	// mean "show the plan". It stays only to point at plan.
	f.BoolVar(&c.dryRun, "dry-run", false, "replaced by: kubectl erasure plan")
	_ = f.MarkHidden("dry-run")
	_ = cmd.RegisterFlagCompletionFunc("store", o.completeStores)
	return cmd
}

func (c *createOptions) run(cmd *cobra.Command, name string) error {
	ctx := cmd.Context()
	if c.dryRun {
		return errors.New(`--dry-run was replaced by "kubectl erasure plan" (same flags): it shows what would be erased and leaves nothing behind`)
	}
	if c.export {
		return c.runExport(cmd, name)
	}
	if c.timeout < 0 {
		return errors.New("--timeout must not be negative")
	}
	if err := c.out.validate(); err != nil {
		return err
	}
	ns, err := c.namespace()
	if err != nil {
		return err
	}
	// Bad input is reported before anything talks to the cluster.
	er, err := c.spec.request(name, ns, c.streams.In, time.Now())
	if err != nil {
		return err
	}
	c.warnLate(er)
	cl, _, err := c.client()
	if err != nil {
		return err
	}
	// The API server's admission rules, without creating anything.
	if err := cl.Create(ctx, er.DeepCopy(), client.DryRunAll); err != nil {
		return fmt.Errorf("the API server refuses the request: %w", err)
	}
	if err := cl.Create(ctx, er); err != nil {
		return err
	}
	if c.wait {
		last, err := waitFor(ctx, cl, ns, name, c.timeout, c.streams.ErrOut)
		if last != nil {
			er = last
		}
		if perr := c.print(er); perr != nil {
			return perr
		}
		return err
	}
	return c.print(er)
}

func (c *createOptions) print(er *lethev1.ErasureRequest) error {
	if c.out.human() {
		return printTable(c.streams.Out, requestTable(time.Now(), c.out.isWide(), er), c.out.isWide())
	}
	return c.out.printObj(er, c.streams.Out)
}

// warnLate says so when the deadline has already passed: the request is
// still owed, and still valid.
func (c *createOptions) warnLate(er *lethev1.ErasureRequest) {
	if deadlinePassed(er, time.Now()) {
		fmt.Fprintf(c.streams.ErrOut, "Warning: --requested-at is more than a month ago: the deadline (%s) has passed\n",
			er.Spec.RequestedAt.AddDate(0, 1, 0).UTC().Format(time.RFC3339))
	}
}

// runExport prints the manifest for Git. It needs no cluster: the
// namespace is the -n flag's, or none (the GitOps tool's destination).
func (c *createOptions) runExport(cmd *cobra.Command, name string) error {
	if c.wait {
		return errors.New("--export and --wait exclude each other: an exported request is created by your GitOps tool")
	}
	if !cmd.Flags().Changed("output") {
		c.out.format = "yaml"
	}
	if err := c.out.onlyFormats("yaml", "json"); err != nil {
		return fmt.Errorf("--export: %w", err)
	}
	ns := ""
	if c.flags.Namespace != nil {
		ns = *c.flags.Namespace
	}
	er, err := c.spec.request(name, ns, c.streams.In, time.Now())
	if err != nil {
		return err
	}
	c.warnLate(er)
	u, err := manifest(er)
	if err != nil {
		return err
	}
	return c.out.printObj(u, c.streams.Out)
}

// manifest is the request as it belongs in Git: apiVersion and kind set,
// no status, no server-set metadata, the grace period as written ("72h",
// not "72h0m0s").
func manifest(er *lethev1.ErasureRequest) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(er)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	delete(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	if g := er.Spec.GracePeriod; g != nil {
		if err := unstructured.SetNestedField(u.Object, shortDuration(g.Duration), "spec", "gracePeriod"); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// shortDuration drops a duration's zero minutes and seconds: 72h, 1h30m, 90s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
