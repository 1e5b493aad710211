package erasurecli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func newCancel(o *options) *cobra.Command {
	out := newOutputFlags()
	cmd := &cobra.Command{
		Use:               "cancel NAME",
		Short:             "Cancel a request during its grace period (the tombstones are lifted)",
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
			if er.Spec.Cancel {
				fmt.Fprintf(o.streams.ErrOut, "erasurerequest %s is already cancelled (phase %s)\n", er.Name, er.Status.Phase)
			} else {
				base := er.DeepCopy()
				er.Spec.Cancel = true
				if err := cl.Patch(cmd.Context(), er, client.MergeFrom(base)); err != nil {
					return err
				}
				fmt.Fprintf(o.streams.ErrOut, "erasurerequest %s: cancel requested (phase %s); once deletion has started a cancel is too late and the history says so\n", er.Name, er.Status.Phase)
			}
			if out.human() {
				return printTable(o.streams.Out, requestTable(time.Now(), out.isWide(), er), out.isWide())
			}
			return out.printObj(er, o.streams.Out)
		},
	}
	out.addFlags(cmd)
	return cmd
}
