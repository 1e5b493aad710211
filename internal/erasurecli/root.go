// Package erasurecli is the kubectl-erasure plugin: the operator's and the
// auditor's command line for ErasureRequests (create, cancel, history,
// verify, receipt), on cli-runtime's kubeconfig flags.
package erasurecli

import (
	"fmt"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// options is what every subcommand shares.
type options struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
}

// client builds a client for the kubeconfig flags, and the namespace to use.
func (o *options) client() (client.Client, string, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	if err := lethev1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
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
		Short: "Create, cancel and audit Lethe ErasureRequests",
		Long: `kubectl erasure works with Lethe's ErasureRequests (erasure.lethe.dev/v1alpha1):
create one (the equivalent of memory-forget), cancel it during its grace period,
read its history, verify its hash chain and signed receipt, print the receipt.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(newCreate(o), newCancel(o), newHistory(o), newVerify(o), newReceipt(o))
	return root
}
