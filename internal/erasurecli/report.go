package erasurecli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/report"
	"github.com/lethe-dev/lethe/internal/version"
)

func newReport(o *options) *cobra.Command {
	var keys keyFlags
	var bundleFile string
	cmd := &cobra.Command{
		Use:               "report (NAME | --bundle FILE)",
		ValidArgsFunction: o.completeRequests,
		Short:             "Render a request's certificate of erasure as one HTML page, verified as it is rendered",
		Long: `Verifies the request (or an exported bundle, with no cluster) exactly as 'verify'
does and renders the outcome as a one-page HTML certificate of erasure on standard
output: what was asked and when, what each step erased and checked, the backups and
their expirations, the receipt, its key and its place in the store's receipt log.
The verification banner is computed now, never copied from the bundle. A request
that does not verify, or is not a complete proof (in progress, cancelled, unsigned,
not in the receipt log), is rendered too, marked NOT VERIFIED with the reason, and
the command exits 1 or 3 as verify does.`,
		Args: nameOrBundle(&bundleFile),
		RunE: func(cmd *cobra.Command, args []string) error {
			er, ks, err := o.reportInput(cmd.Context(), args, bundleFile, &keys)
			if err != nil {
				return err
			}
			rep, verr := evidence.VerifyRequest(cmd.Context(), er, evidence.Options{KeySet: ks, AllowUnsigned: keys.allowUnsigned})
			if err := report.RenderHTML(o.streams.Out, certificate(er, ks, rep, verr)); err != nil {
				return err
			}
			if verr != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("erasurerequest %s does NOT verify: %w", er.Name, verr)}
			}
			if why := rep.Incomplete(); why != "" {
				return &ExitError{Code: 3, Err: fmt.Errorf("erasurerequest %s is not a complete proof of erasure: %s", er.Name, why)}
			}
			return nil
		},
	}
	keys.add(cmd)
	cmd.Flags().StringVar(&bundleFile, "bundle", "", "render an exported bundle file, with no cluster")
	return cmd
}

// reportInput is the request and key set to report on: from the bundle
// (pinned keys when given), else from the cluster.
func (o *options) reportInput(ctx context.Context, args []string, bundleFile string, keys *keyFlags) (*lethev1.ErasureRequest, evidence.KeySet, error) {
	if bundleFile == "" {
		cl, er, err := o.get(ctx, args[0])
		if err != nil {
			return nil, evidence.KeySet{}, err
		}
		ks, _, err := keys.load(ctx, cl)
		if err != nil && !keys.allowUnsigned {
			return nil, ks, &ExitError{Code: 2, Err: err}
		}
		return er, ks, nil
	}
	raw, err := os.ReadFile(bundleFile)
	if err != nil {
		return nil, evidence.KeySet{}, err
	}
	b, err := evidence.ReadBundle(raw)
	if err != nil {
		return nil, evidence.KeySet{}, &ExitError{Code: 1, Err: err}
	}
	ks, _, pinned, err := keys.fromFiles()
	if err != nil {
		return nil, ks, &ExitError{Code: 2, Err: err}
	}
	if !pinned {
		ks = b.KeySet
	}
	return b.Request, ks, nil
}

// receiptInfo is the certificate's receipt: the time it was issued as the
// receipt signed it, when it was verified (the status's copy is not
// signed).
func receiptInfo(r *lethev1.Receipt, rep *evidence.Report) *report.ReceiptInfo {
	if r == nil {
		return nil
	}
	out := &report.ReceiptInfo{Digest: r.Digest, KeyID: r.KeyID}
	if r.IssuedAt != nil {
		out.IssuedAt = r.IssuedAt.Time
	}
	if rep != nil && rep.Receipt != nil && rep.Receipt.Predicate != nil {
		if t, err := time.Parse(time.RFC3339, rep.Receipt.Predicate.IssuedAt); err == nil {
			out.IssuedAt = t
		}
	}
	return out
}

// certificate fills the page's model from the request and the outcome of
// its verification.
func certificate(er *lethev1.ErasureRequest, ks evidence.KeySet, rep *evidence.Report, verr error) report.Certificate {
	st := &er.Status
	c := report.Certificate{
		Request: report.RequestInfo{Namespace: er.Namespace, Name: er.Name, UID: string(er.UID), Store: er.Spec.StoreRef.Name,
			Sessions: len(er.Spec.SessionIDs), Immediate: er.Spec.Immediate, Phase: string(st.Phase), RequestedAt: er.CreationTimestamp.Time},
		Verification:   report.Verification{OK: verr == nil && rep.Complete(), Checks: rep.Checks},
		EvidenceFormat: formatOf(er), LetheVersion: version.Get().Version, GeneratedAt: time.Now().UTC(),
	}
	switch {
	case verr != nil:
		c.Verification.Failure = verr.Error()
	case !rep.Complete():
		c.Verification.Failure = "not a complete proof of erasure: " + rep.Incomplete()
	}
	if er.Spec.RequestedAt != nil {
		c.Request.RequestedAt = er.Spec.RequestedAt.Time
	}
	if st.Deadline != nil {
		c.Request.Deadline = st.Deadline.Time
	}
	if p := st.Plan; p != nil {
		c.Request.SessionsFound, c.Request.SessionsNotFound = int(p.SessionsFound), len(p.NotFoundSessionIDs)
		c.Plan = counts(p.Rows)
	}
	for _, h := range st.History {
		c.Milestones = append(c.Milestones, report.Milestone{Phase: string(h.Phase), Event: h.Event, Time: h.Time.Time, KeyID: h.KeyID})
	}
	if st.Evidence != nil {
		for _, s := range st.Evidence.Steps {
			c.Steps = append(c.Steps, step(s))
			for _, b := range s.Backups {
				c.Backups = append(c.Backups, report.Backup{Name: b.Name, StartedAt: tp(b.StartedAt), OriginalExpiration: tp(b.OriginalExpiration),
					Expiration: tp(b.Expiration), GoneAt: tp(b.GoneAt), DeleteBackupRequest: b.DeleteBackupRequest})
			}
		}
	}
	for _, k := range ks.Keys {
		c.Keys = append(c.Keys, report.Key{ID: k.KeyID, Validity: k.Validity()})
	}
	c.Receipt = receiptInfo(st.Receipt, rep)
	if rep.Log != nil {
		c.Log = &report.LogInfo{Origin: rep.Log.Origin, Index: rep.Log.Index, Size: rep.Log.Size}
	}
	return c
}

func step(s lethev1.StepEvidence) report.Step {
	out := report.Step{Name: s.Step, StartedAt: tp(s.StartedAt), CompletedAt: tp(s.CompletedAt), VacuumedAt: tp(s.VacuumedAt),
		Counts: counts(s.Counts), Note: s.Note}
	for _, v := range s.Verification {
		out.Checks = append(out.Checks, report.Check{Check: v.Check, Found: v.Found})
	}
	return out
}

func counts(tc []lethev1.TableCount) []report.Count {
	out := make([]report.Count, 0, len(tc))
	for _, c := range tc {
		out = append(out, report.Count{Table: c.Table, Rows: c.Rows})
	}
	return out
}

func tp(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := t.Time
	return &v
}
