package erasurecli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
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

func newVerify(o *options) *cobra.Command {
	var keyFile, keyConfigMap string
	cmd := &cobra.Command{
		Use:               "verify NAME",
		ValidArgsFunction: o.completeRequests,
		Short:             "Recompute the history's hash chain and check the receipt's signature",
		Long: `Recomputes every digest of the request's history and checks that the receipt covers
an entry of it and is signed by Lethe's key (from --public-key, or the ConfigMap the
manager publishes). Exits 1 naming the first wrong entry when the chain does not
verify, 1 when the signature does not, 2 when the key cannot be found.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			cl, er, err := o.get(ctx, args[0])
			if err != nil {
				return err
			}
			if err := evidence.Verify(er.Status.History); err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("erasurerequest %s does NOT verify: %w", er.Name, err)}
			}
			fmt.Fprintf(o.streams.Out, "history: %d entries, hash chain verifies (head %s)\n", len(er.Status.History), short(evidence.Head(er.Status.History)))
			if er.Status.Receipt == nil {
				fmt.Fprintf(o.streams.Out, "receipt: none yet (phase %s)\n", er.Status.Phase)
				return nil
			}
			if er.Status.Receipt.Envelope == "" {
				if err := evidence.VerifyReceipt(ctx, er, nil); err != nil {
					return &ExitError{Code: 1, Err: fmt.Errorf("erasurerequest %s does NOT verify: %w", er.Name, err)}
				}
				fmt.Fprintln(o.streams.Out, "receipt: unsigned (no signing key was configured); it covers an entry of the verified chain")
				return nil
			}
			key, where, err := loadKey(ctx, cl, keyFile, keyConfigMap)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if err := evidence.VerifyReceipt(ctx, er, key); err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("erasurerequest %s does NOT verify: %w", er.Name, err)}
			}
			fmt.Fprintf(o.streams.Out, "receipt: signature verifies with key %s (%s) over %s\nverified\n", short(key.ID()), where, short(er.Status.Receipt.Digest))
			return nil
		},
	}
	cmd.Flags().StringVar(&keyFile, "public-key", "", "PEM file with Lethe's receipt public key (default: the published ConfigMap)")
	cmd.Flags().StringVar(&keyConfigMap, "key-configmap", "lethe-system/lethe-receipt-key", "NAMESPACE/NAME of the ConfigMap the manager publishes its public key in")
	return cmd
}

func loadKey(ctx context.Context, cl client.Client, file, configMap string) (*evidence.Key, string, error) {
	if file != "" {
		pemBytes, err := os.ReadFile(file)
		if err != nil {
			return nil, "", err
		}
		k, err := evidence.ParsePublicKey(pemBytes)
		return k, file, err
	}
	var nn types.NamespacedName
	if _, err := fmt.Sscanf(configMapArg(configMap), "%s %s", &nn.Namespace, &nn.Name); err != nil {
		return nil, "", fmt.Errorf("--key-configmap: want NAMESPACE/NAME, got %q", configMap)
	}
	cm := &corev1.ConfigMap{}
	if err := cl.Get(ctx, nn, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", fmt.Errorf("the receipt is signed but no public key was found: ConfigMap %s does not exist (pass --public-key)", configMap)
		}
		return nil, "", err
	}
	pemBytes, ok := cm.Data["public-key.pem"]
	if !ok {
		return nil, "", errors.New("ConfigMap " + configMap + " has no public-key.pem")
	}
	k, err := evidence.ParsePublicKey([]byte(pemBytes))
	return k, "ConfigMap " + configMap, err
}

func configMapArg(s string) string {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i] + " " + s[i+1:]
		}
	}
	return s
}
