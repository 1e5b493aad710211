package erasurecli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/version"
)

// ExitError carries the exit code a failed verification ends with.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// get reads one request of the namespace.
func (o *options) get(ctx context.Context, name string) (client.Client, *lethev1.ErasureRequest, error) {
	cl, ns, err := o.client()
	if err != nil {
		return nil, nil, err
	}
	er := &lethev1.ErasureRequest{}
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, er); err != nil {
		return nil, nil, err
	}
	return cl, er, nil
}

func newReceipt(o *options) *cobra.Command {
	return &cobra.Command{
		Use:               "receipt NAME",
		ValidArgsFunction: o.completeRequests,
		Short:             "Print the request's receipt (the DSSE envelope when signed) as JSON",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, er, err := o.get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			r := er.Status.Receipt
			if r == nil {
				return fmt.Errorf("erasurerequest %s has no receipt yet (phase %s)", er.Name, er.Status.Phase)
			}
			var out []byte
			if r.Envelope != "" {
				var buf bytes.Buffer
				if err := json.Indent(&buf, []byte(r.Envelope), "", "  "); err != nil {
					return err
				}
				out = buf.Bytes()
			} else if out, err = json.MarshalIndent(r, "", "  "); err != nil {
				return err
			}
			_, err = fmt.Fprintln(o.streams.Out, string(out))
			return err
		},
	}
}

// keyFlags say where the public keys come from.
type keyFlags struct {
	publicKey, keySet, configMap string
	allowUnsigned                bool
}

func (k *keyFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.publicKey, "public-key", "", "PEM file with a Lethe public key to trust (valid at any time)")
	cmd.Flags().StringVar(&k.keySet, "key-set", "", "key set JSON file to trust (the "+keySetKey+" of the ConfigMap, saved earlier)")
	cmd.Flags().StringVar(&k.configMap, "key-configmap", "lethe-system/lethe-receipt-key", "NAMESPACE/NAME of the ConfigMap the manager publishes its key set in")
	cmd.Flags().BoolVar(&k.allowUnsigned, "allow-unsigned", false, "accept a history and receipt written with no signing key (they then prove only that nothing changed since)")
}

// keySetKey is the ConfigMap key of the published key set.
const keySetKey = "keyset.json"

// fromFiles is the key set of --key-set or --public-key; ok is false when
// neither is given.
func (k *keyFlags) fromFiles() (ks evidence.KeySet, where string, ok bool, err error) {
	switch {
	case k.keySet != "":
		raw, err := os.ReadFile(k.keySet)
		if err != nil {
			return ks, "", true, err
		}
		ks, err = evidence.ParseKeySet(raw)
		return ks, k.keySet, true, err
	case k.publicKey != "":
		pemBytes, err := os.ReadFile(k.publicKey)
		if err != nil {
			return ks, "", true, err
		}
		key, err := evidence.ParsePublicKey(pemBytes)
		if err != nil {
			return ks, "", true, err
		}
		return evidence.KeySet{Keys: []evidence.PublishedKey{{KeyID: key.ID(), PublicKey: string(pemBytes), ValidFrom: time.Unix(0, 0).UTC()}}}, k.publicKey, true, nil
	}
	return ks, "", false, nil
}

// load is the key set to verify with: from the files, else the ConfigMap.
func (k *keyFlags) load(ctx context.Context, cl client.Client) (evidence.KeySet, string, error) {
	if ks, where, ok, err := k.fromFiles(); ok || err != nil {
		return ks, where, err
	}
	var nn types.NamespacedName
	if _, err := fmt.Sscanf(configMapArg(k.configMap), "%s %s", &nn.Namespace, &nn.Name); err != nil {
		return evidence.KeySet{}, "", fmt.Errorf("--key-configmap: want NAMESPACE/NAME, got %q", k.configMap)
	}
	cm := &corev1.ConfigMap{}
	if err := cl.Get(ctx, nn, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return evidence.KeySet{}, "", fmt.Errorf("no key set: ConfigMap %s does not exist (pass --key-set or --public-key)", k.configMap)
		}
		return evidence.KeySet{}, "", err
	}
	where := "ConfigMap " + k.configMap
	if raw, ok := cm.Data[keySetKey]; ok {
		ks, err := evidence.ParseKeySet([]byte(raw))
		return ks, where, err
	}
	pemBytes, ok := cm.Data["public-key.pem"]
	if !ok {
		return evidence.KeySet{}, "", errors.New("ConfigMap " + k.configMap + " has neither " + keySetKey + " nor public-key.pem")
	}
	key, err := evidence.ParsePublicKey([]byte(pemBytes))
	if err != nil {
		return evidence.KeySet{}, "", err
	}
	return evidence.KeySet{Keys: []evidence.PublishedKey{{KeyID: key.ID(), PublicKey: pemBytes, ValidFrom: time.Unix(0, 0).UTC()}}}, where, nil
}

// nameOrBundle accepts one request NAME or --bundle FILE, not both.
func nameOrBundle(bundleFile *string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if (*bundleFile == "") == (len(args) == 0) || len(args) > 1 {
			return errors.New("give either one request NAME or --bundle FILE")
		}
		return nil
	}
}

func newVerify(o *options) *cobra.Command {
	var keys keyFlags
	var bundleFile string
	cmd := &cobra.Command{
		Use:               "verify (NAME | --bundle FILE)",
		ValidArgsFunction: o.completeRequests,
		Short:             "Verify a request's proof: history chain, signatures, evidence digests, receipt, log inclusion",
		Long: `Verifies a request's proof as an auditor would (docs/evidence-format.md): every
history digest recomputes and chains; every entry is signed by a key of the key set
that was current when it signed; the plan and step evidence recompute to the digest
the last entry recorded; the receipt is signed, names this request and covers an
entry; the store's receipt log holds it under a signed checkpoint.

With --bundle FILE it needs no cluster: the bundle (from 'kubectl erasure export')
carries the request and the key set. Pin the keys you trust with --key-set or
--public-key; otherwise the bundle's own key set is used and the output says so.

Exits 0 for a complete proof (signed, finished, the receipt in the store's log);
1 naming what is wrong when anything does not verify; 2 when no key can be found;
3 when everything verifies but the proof is not complete (in progress, cancelled,
unsigned, or the receipt not yet in the log), saying which.`,
		Args: nameOrBundle(&bundleFile),
		RunE: func(cmd *cobra.Command, args []string) error {
			if bundleFile != "" {
				return o.verifyBundle(cmd.Context(), bundleFile, &keys)
			}
			return o.verifyOnline(cmd.Context(), args[0], &keys)
		},
	}
	keys.add(cmd)
	cmd.Flags().StringVar(&bundleFile, "bundle", "", "verify an exported bundle file, with no cluster")
	return cmd
}

func (o *options) verifyOnline(ctx context.Context, name string, keys *keyFlags) error {
	cl, er, err := o.get(ctx, name)
	if err != nil {
		return err
	}
	ks, where, err := keys.load(ctx, cl)
	if err != nil && !keys.allowUnsigned {
		return &ExitError{Code: 2, Err: err}
	}
	rep, err := evidence.VerifyRequest(ctx, er, evidence.Options{KeySet: ks, AllowUnsigned: keys.allowUnsigned})
	return o.printVerification(er, rep, err, "keys from "+where)
}

func (o *options) verifyBundle(ctx context.Context, file string, keys *keyFlags) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	b, err := evidence.ReadBundle(raw)
	if err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("bundle %s does NOT verify: %w", file, err)}
	}
	trusted, where, ok, err := keys.fromFiles()
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	var pin *evidence.KeySet
	if ok {
		pin = &trusted
	} else {
		where = "the bundle's own key set (not pinned: pass --key-set or --public-key to trust only keys you hold)"
	}
	rep, err := evidence.VerifyBundle(ctx, b, pin, keys.allowUnsigned)
	return o.printVerification(b.Request, rep, err, "keys from "+where)
}

// printVerification prints what was checked, then the verdict.
func (o *options) printVerification(er *lethev1.ErasureRequest, rep *evidence.Report, verr error, keys string) error {
	w := o.streams.Out
	fmt.Fprintf(w, "erasurerequest %s/%s (UID %s), evidence format %s; %s\n", er.Namespace, er.Name, er.UID, formatOf(er), keys)
	for _, c := range rep.Checks {
		fmt.Fprintf(w, "  ok  %s\n", c)
	}
	if verr != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("erasurerequest %s does NOT verify: %w", er.Name, verr)}
	}
	for _, k := range rep.SignedBy {
		fmt.Fprintf(w, "key %s: %s\n", k.KeyID, k.Validity())
	}
	if why := rep.Incomplete(); why != "" {
		// Everything checked verifies, but it is not a complete proof.
		return &ExitError{Code: 3, Err: fmt.Errorf("erasurerequest %s is not a complete proof of erasure: %s", er.Name, why)}
	}
	fmt.Fprintln(w, "verified")
	return nil
}

func formatOf(er *lethev1.ErasureRequest) string {
	if er.Status.EvidenceFormat == "" {
		return "legacy (unkeyed)"
	}
	return er.Status.EvidenceFormat
}

func newExport(o *options) *cobra.Command {
	var keys keyFlags
	cmd := &cobra.Command{
		Use:               "export NAME",
		ValidArgsFunction: o.completeRequests,
		Short:             "Write a request's proof as a self-contained bundle (JSON) to standard output",
		Long: `Writes the request (spec, plan, evidence, signed history, receipt and its place in
the store's receipt log) and the published key set as one JSON bundle that
'kubectl erasure verify --bundle FILE' and 'kubectl erasure report --bundle FILE'
read with no cluster. It holds the request as the cluster does: its session IDs and
spec.reason (free text that must hold no personal data) included; the signed
statement inside holds neither.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			cl, er, err := o.get(ctx, args[0])
			if err != nil {
				return err
			}
			ks, _, err := keys.load(ctx, cl)
			if err != nil && !keys.allowUnsigned {
				return &ExitError{Code: 2, Err: err}
			}
			b := evidence.NewBundle(er, ks, "kubectl-erasure "+version.Get().Version, time.Now())
			enc := json.NewEncoder(o.streams.Out)
			enc.SetIndent("", "  ")
			return enc.Encode(b)
		},
	}
	keys.add(cmd)
	return cmd
}
func configMapArg(s string) string {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i] + " " + s[i+1:]
		}
	}
	return s
}
