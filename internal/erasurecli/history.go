package erasurecli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

func newHistory(o *options) *cobra.Command {
	out := newOutputFlags()
	cmd := &cobra.Command{
		Use:   "history NAME",
		Short: "Show a request's history: its hash chain, entry by entry",
		Long: `Shows the request's history, the hash chain of its transitions. Digests are
shortened in the table; --wide (or -o wide) shows them whole, -o json or -o yaml
print the object with its full history.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeRequests,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			_, er, err := o.get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !out.human() {
				return out.printObj(er, o.streams.Out)
			}
			return printHistory(o.streams.Out, er, out.isWide())
		},
	}
	out.addFlags(cmd)
	return cmd
}

// printHistory is history's table form, with the receipt under it.
func printHistory(w io.Writer, er *lethev1.ErasureRequest, wide bool) error {
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "#", Type: "integer"}, {Name: "Time", Type: "string"}, {Name: "Phase", Type: "string"},
		{Name: "Event", Type: "string"}, {Name: "Evidence", Type: "string"}, {Name: "Digest", Type: "string"},
		{Name: "Signed by", Type: "string"}, {Name: "Previous", Type: "string", Priority: 1}}}
	for i, h := range er.Status.History {
		signer := "unsigned"
		if h.Signature != "" {
			signer = digest(h.KeyID, wide)
		}
		t.Rows = append(t.Rows, metav1.TableRow{Cells: []any{strconv.Itoa(i), h.Time.UTC().Format(time.RFC3339), string(h.Phase),
			dash(h.Event), digest(h.EvidenceDigest, wide), digest(h.Digest, wide), signer, digest(h.PreviousDigest, wide)}})
	}
	if len(t.Rows) == 0 {
		fmt.Fprintf(w, "erasurerequest %s has no history yet\n", er.Name)
	} else if err := printTable(w, t, wide); err != nil {
		return err
	}
	if r := er.Status.Receipt; r != nil {
		signed := "unsigned"
		if r.Envelope != "" {
			signed = "signed with key " + digest(r.KeyID, wide)
		}
		fmt.Fprintf(w, "receipt over %s, %s\n", digest(r.Digest, wide), signed)
	}
	return nil
}
