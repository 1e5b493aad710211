package erasurecli

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Output formats besides cli-runtime's machine formats (json, yaml, name,
// jsonpath, go-template, ...): the human table, and the table with every
// column and full digests.
const (
	outputTable = "table"
	outputWide  = "wide"
)

// outputFlags is -o/--output and --wide. Machine formats go through
// cli-runtime's PrintFlags (so -o json, yaml, name, jsonpath behave as in
// kubectl); table and wide through its table printer.
type outputFlags struct {
	print  *genericclioptions.PrintFlags
	format string
	wide   bool
}

// newOutputFlags: the table by default.
func newOutputFlags() *outputFlags {
	// No operation: -o name prints the bare name, as kubectl create -o name does.
	f := &outputFlags{print: genericclioptions.NewPrintFlags("").WithTypeSetter(scheme), format: outputTable}
	f.print.OutputFormat = &f.format
	return f
}

func (f *outputFlags) addFlags(cmd *cobra.Command) {
	f.print.JSONYamlPrintFlags.AddFlags(cmd)
	f.print.TemplatePrinterFlags.AddFlags(cmd)
	cmd.Flags().StringVarP(&f.format, "output", "o", f.format,
		"output format: one of "+strings.Join(f.allowed(), ", "))
	cmd.Flags().BoolVar(&f.wide, "wide", false, "show every column and full digests (same as -o wide)")
	f.print.OutputFlagSpecified = func() bool { return cmd.Flag("output").Changed }
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(f.allowed(), cobra.ShellCompDirectiveNoFileComp))
}

func (f *outputFlags) allowed() []string {
	return append([]string{outputTable, outputWide}, f.print.AllowedFormats()...)
}

// human is true for the table forms.
func (f *outputFlags) human() bool { return f.format == outputTable || f.format == outputWide }

// isWide: full digests and every column.
func (f *outputFlags) isWide() bool { return f.wide || f.format == outputWide }

// validate refuses an unknown -o before anything reaches the cluster.
func (f *outputFlags) validate() error {
	if f.human() {
		return nil
	}
	_, err := f.print.ToPrinter()
	return err
}

// printObj prints an object in a machine format.
func (f *outputFlags) printObj(obj runtime.Object, w io.Writer) error {
	p, err := f.print.ToPrinter()
	if err != nil {
		return err
	}
	return p.PrintObj(obj, w)
}

// printTable prints a metav1.Table with cli-runtime's table printer;
// columns of priority 1 only when wide.
func printTable(w io.Writer, t *metav1.Table, wide bool) error {
	return printers.NewTablePrinter(printers.PrintOptions{Wide: wide}).PrintObj(t, w)
}

// digest shortens a digest for the table; wide keeps it whole.
func digest(d string, wide bool) string {
	if wide || d == "" {
		return dash(d)
	}
	return short(d)
}

func short(d string) string {
	if len(d) > 19 {
		return d[:19] + "…"
	}
	return d
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// timestamp is an RFC 3339 time, or "-" when unset.
func timestamp(t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// age is kubectl's short duration since t ("5m", "3d").
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

// relative says how far t is from now: "in 6d23h" or "2h ago".
func relative(t time.Time, now time.Time) string {
	if t.After(now) {
		return "in " + duration.HumanDuration(t.Sub(now))
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}

// indent prefixes every line written through it, to nest a printed table
// under a heading.
type indent struct {
	w      io.Writer
	prefix string
	mid    bool
}

func (i *indent) Write(p []byte) (int, error) {
	var b strings.Builder
	for _, c := range string(p) {
		if !i.mid {
			b.WriteString(i.prefix)
			i.mid = true
		}
		b.WriteRune(c)
		if c == '\n' {
			i.mid = false
		}
	}
	if _, err := io.WriteString(i.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// requestTable is the table of requests that create and cancel print.
func requestTable(now time.Time, wide bool, ers ...*lethev1.ErasureRequest) *metav1.Table {
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name"},
		{Name: "Phase", Type: "string"},
		{Name: "Store", Type: "string"},
		{Name: "Sessions", Type: "integer"},
		{Name: "Waiting for", Type: "string"},
		{Name: "Deadline", Type: "string"},
		{Name: "Age", Type: "string"},
		{Name: "Grace ends", Type: "string", Priority: 1},
		{Name: "Immediate", Type: "boolean", Priority: 1},
		{Name: "History head", Type: "string", Priority: 1},
	}}
	for _, er := range ers {
		waiting := "-"
		if w := nextWait(er); w != nil {
			waiting = w.Condition
			if w.Reason != "" {
				waiting += " (" + w.Reason + ")"
			}
		}
		head := ""
		if n := len(er.Status.History); n > 0 {
			head = er.Status.History[n-1].Digest
		}
		t.Rows = append(t.Rows, metav1.TableRow{Cells: []any{
			er.Name, dash(string(er.Status.Phase)), er.Spec.StoreRef.Name, len(er.Spec.SessionIDs), waiting,
			timestamp(er.Status.Deadline), age(er.CreationTimestamp, now),
			timestamp(er.Status.GraceEndsAt), er.Spec.Immediate, digest(head, wide),
		}})
	}
	return t
}

// onlyFormats refuses an -o value a command has no use for (--export
// prints a manifest: yaml or json only).
func (f *outputFlags) onlyFormats(only ...string) error {
	if len(only) == 0 || slices.Contains(only, f.format) {
		return nil
	}
	return fmt.Errorf("-o %s is not available here; use one of: %s", f.format, strings.Join(only, ", "))
}
