package erasurecli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// kubectlPluginCompletion is the helper kubectl (1.26 and later) runs to
// complete `kubectl erasure ...`: an executable named
// kubectl_complete-erasure on the PATH that answers cobra's __complete.
const kubectlPluginCompletion = `#!/usr/bin/env sh
# Completion for "kubectl erasure": kubectl runs kubectl_complete-<plugin>
# from the PATH with the words typed after the plugin's name.
exec kubectl-erasure __complete "$@"
`

func newCompletion(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "completion SHELL",
		Short: "Print a shell completion script (bash, zsh, fish, powershell, or kubectl for the plugin helper)",
		Long: `Prints a completion script for the shell named.

For "kubectl erasure ..." (the plugin run through kubectl), kubectl 1.26 and later
complete a plugin by running kubectl_complete-<plugin> from the PATH. Install that
helper next to kubectl-erasure:

  kubectl erasure completion kubectl > ~/.local/bin/kubectl_complete-erasure
  chmod +x ~/.local/bin/kubectl_complete-erasure

For kubectl-erasure called directly, load the script for your shell, e.g.

  source <(kubectl-erasure completion bash)
  kubectl-erasure completion zsh > "${fpath[1]}/_kubectl-erasure"
  kubectl-erasure completion fish > ~/.config/fish/completions/kubectl-erasure.fish
  kubectl-erasure completion powershell | Out-String | Invoke-Expression`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []cobra.Completion{"bash", "zsh", "fish", "powershell", "kubectl"},
		RunE: func(cmd *cobra.Command, args []string) error {
			root, out := cmd.Root(), o.streams.Out
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(out)
			case "kubectl":
				_, err := fmt.Fprint(out, kubectlPluginCompletion)
				return err
			}
			return fmt.Errorf("unknown shell %q: one of bash, zsh, fish, powershell, kubectl", args[0])
		},
	}
	return cmd
}

// completeRequests completes a command's NAME with the ErasureRequests of
// the namespace (one name per command).
func (o *options) completeRequests(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return o.completeNames(cmd.Context(), &lethev1.ErasureRequestList{})
}

// completeStores completes --store with the MemoryStores of the namespace.
func (o *options) completeStores(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return o.completeNames(cmd.Context(), &lethev1.MemoryStoreList{})
}

// completeNames lists the names of a namespaced kind; nothing (and no file
// names) when the cluster cannot be read.
func (o *options) completeNames(ctx context.Context, list client.ObjectList) ([]cobra.Completion, cobra.ShellCompDirective) {
	if ctx == nil {
		ctx = context.Background()
	}
	cl, ns, err := o.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := cl.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []cobra.Completion
	_ = meta.EachListItem(list, func(obj runtime.Object) error {
		if m, err := meta.Accessor(obj); err == nil {
			names = append(names, m.GetName())
		}
		return nil
	})
	return names, cobra.ShellCompDirectiveNoFileComp
}
