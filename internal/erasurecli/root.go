// Package erasurecli is the kubectl-erasure plugin: the operator's and the
// auditor's command line for ErasureRequests (create, plan, status, cancel,
// history, verify, receipt, export, receipts, report, version, completion),
// on cli-runtime's kubeconfig flags and printers.
package erasurecli

import (
	"fmt"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// scheme holds every type the plugin reads: Lethe's, and the core types it
// looks at beside them (ConfigMaps with keys, events, the manager's Deployment).
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, eventsv1.AddToScheme, appsv1.AddToScheme, lethev1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// options is what every subcommand shares.
type options struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
}

// namespace is the namespace to work in (-n, else the kubeconfig context's).
func (o *options) namespace() (string, error) {
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	return ns, err
}

// client builds a client (with watch) for the kubeconfig flags, and the namespace to use.
func (o *options) client() (client.WithWatch, string, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	ns, err := o.namespace()
	if err != nil {
		return nil, "", err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("connect to the cluster: %w", err)
	}
	return c, ns, nil
}

// NewCommand returns `kubectl erasure` with its subcommands.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{flags: genericclioptions.NewConfigFlags(true), streams: streams}
	root := &cobra.Command{
		Use:   "kubectl-erasure",
		Short: "Create, plan, follow, cancel and audit Lethe ErasureRequests",
		Long: `kubectl erasure works with Lethe's ErasureRequests (erasure.lethe.dev/v1alpha1):
plan an erasure, create one (or export its manifest for Git), follow it, cancel it
during its grace period, read its status and history; verify its signed history,
evidence and receipt, online or from an exported bundle with no cluster; verify
what a store's database holds and its append-only receipt log; render a
certificate of erasure.`,
		// Help and usage read "kubectl erasure", as the plugin is invoked.
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl erasure"},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.flags.AddFlags(root.PersistentFlags())
	// Our own completion command prints the kubectl plugin helper too.
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(newCreate(o), newPlan(o), newStatus(o), newCancel(o), newHistory(o), newVerify(o), newReceipt(o), newExport(o), newReceipts(o), newReport(o), newRedact(o),
		newVersion(o), newCompletion(o))
	return root
}
