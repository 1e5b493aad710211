package erasurecli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/redact"
)

// redactFlags are the redact command's own flags.
type redactFlags struct {
	store, databaseURL string
	columns            []string
	dryRun             bool
	pages              int64
}

func newRedact(o *options) *cobra.Command {
	f := &redactFlags{}
	cmd := &cobra.Command{
		Use:   "redact --store NAME [--dry-run]",
		Short: "Redact the values rows written before the redaction trigger still hold",
		Long: `Redacts the store's redacted columns (spec.postgres.redactedColumns, by default
memory.rounds.assistant_thinking) in rows written before the database's redaction
trigger existed: secrets and personal data replaced by typed placeholders, as the
trigger does at insert. The table is walked --pages pages at a time, each batch its
own transaction with a receipt in lethe.redaction_receipts (counts per detector,
never a value). Safe to repeat.

With --dry-run nothing is changed (read-only transactions): it prints how many rows
and values per detector a real run would redact.

The database is reached with the store's connection Secret, or --database-url.
Only a column with the redaction trigger (lethe.redact_column) can be redacted.`,
		Example: `  kubectl erasure redact --store memory --dry-run
  kubectl erasure redact --store memory --pages 500`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if f.pages < 1 || f.pages > 100000 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--pages must be between 1 and 100000, got %d", f.pages)}
			}
			for _, c := range f.columns {
				if len(strings.Split(c, ".")) != 3 {
					return &ExitError{Code: 2, Err: fmt.Errorf("--column %q is not schema.table.column", c)}
				}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return o.redact(cmd.Context(), f) },
	}
	cmd.Flags().StringVar(&f.store, "store", "", "the MemoryStore whose database to redact (required)")
	cmd.Flags().StringVar(&f.databaseURL, "database-url", "", "connect with this PostgreSQL URL instead of the store's Secret")
	cmd.Flags().StringSliceVar(&f.columns, "column", nil, "redact this column (schema.table.column) instead of the store's redacted columns; repeatable")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "count what would be redacted; change nothing")
	cmd.Flags().Int64Var(&f.pages, "pages", 1000, "table pages per batch (each batch one transaction)")
	_ = cmd.MarkFlagRequired("store")
	_ = cmd.RegisterFlagCompletionFunc("store", o.completeStores)
	return cmd
}

func (o *options) redact(ctx context.Context, f *redactFlags) error {
	cl, ns, err := o.client()
	if err != nil {
		return err
	}
	store := &lethev1.MemoryStore{}
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: f.store}, store); err != nil {
		return err
	}
	columns := f.columns
	if len(columns) == 0 {
		columns = store.Spec.Postgres.RedactedColumnsOrDefault()
	}
	pool, err := o.storeDatabase(ctx, cl, store, f.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	changed := "CHANGED"
	if f.dryRun {
		changed = "WOULD CHANGE"
	}
	t := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "COLUMN", Type: "string"}, {Name: "PAGES", Type: "integer"}, {Name: "BATCHES", Type: "integer"},
		{Name: "ROWS", Type: "integer"}, {Name: changed, Type: "integer"}, {Name: "VALUES", Type: "string"},
	}}
	for _, c := range columns {
		b, err := postgres.RedactColumn(ctx, pool, c, f.pages, f.dryRun, nil)
		if err != nil {
			return err
		}
		t.Rows = append(t.Rows, metav1.TableRow{Cells: []any{c, b.Pages, b.Batches, b.RowsRead, b.RowsChanged, countsText(b.Counts)}})
	}
	if err := printTable(o.streams.Out, t, false); err != nil {
		return err
	}
	if f.dryRun {
		fmt.Fprintln(o.streams.Out, "dry run: nothing was changed")
	}
	return nil
}

// countsText is "2 email, 1 card", by detector name; "-" for none.
func countsText(c redact.Counts) string {
	if c.Total() == 0 {
		return "-"
	}
	names := slices.Sorted(maps.Keys(c))
	parts := make([]string, 0, len(names))
	for _, n := range names {
		if c[n] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c[n], n))
		}
	}
	return strings.Join(parts, ", ")
}
