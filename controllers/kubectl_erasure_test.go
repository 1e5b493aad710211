package controllers_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasurecli"
)

// kubeconfig writes a kubeconfig for the test API server.
func kubeconfig(t *testing.T) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.Config.CertData, ClientKeyData: cp.Config.KeyData, Token: cp.Config.BearerToken}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubectlErasure runs the plugin in-process, as `kubectl erasure ARGS -n NS`.
func kubectlErasure(t *testing.T, ns string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := erasurecli.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfig(t), "-n", ns))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String() + errOut.String(), err
}

func TestPluginDryRunShowsThePlanAndCreatesNothing(t *testing.T) {
	e := newMemoryEnv(t, "plugin-plan")
	before := e.dump(t)
	out, err := kubectlErasure(t, e.ns, "create", "preview", "--store", e.store.Name, "--session-id", erasedA, "--session-id", otherT2, "--dry-run")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"sessions found: 1", "not found (never touched): 1", otherT2, "memory.rounds", "nothing was tombstoned"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	eventually(t, 10*time.Second, func() error {
		list := &lethev1.ErasureRequestList{}
		if err := k8s.List(context.Background(), list, client.InNamespace(e.ns)); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return errors.New("an ErasureRequest is left in the namespace")
		}
		return nil
	})
	if after := e.dump(t); !maps.Equal(before, after) {
		t.Fatal("the dry run changed the database")
	}
	// Bad input fails before anything reaches the cluster, naming each problem.
	out, err = kubectlErasure(t, e.ns, "create", "bad", "--store", e.store.Name, "--session-id", "NOT-A-UUID", "--immediate")
	if err == nil || !strings.Contains(err.Error(), `"NOT-A-UUID" is not a lowercase canonical UUID`) || !strings.Contains(err.Error(), "--immediate needs --reason") {
		t.Fatalf("bad input: %v\n%s", err, out)
	}
}

func TestPluginCreatesHistoryVerifiesAndCatchesAnAlteredReceipt(t *testing.T) {
	e := newMemoryEnv(t, "plugin-audit")
	out, err := kubectlErasure(t, e.ns, "create", "forget", "--store", e.store.Name, "--session-id", erasedA, "--immediate", "--reason", "DPO-7")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	er := &lethev1.ErasureRequest{}
	er.Namespace, er.Name = e.ns, "forget"
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	assertSignedReceipt(t, er)

	out, err = kubectlErasure(t, e.ns, "history", "forget")
	if err != nil || !strings.Contains(out, "Tombstoned") || !strings.Contains(out, "BackupsRotated") || !strings.Contains(out, "signed with key") {
		t.Fatalf("history: %v\n%s", err, out)
	}
	out, err = kubectlErasure(t, e.ns, "verify", "forget")
	if err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("verify of an untouched request: %v\n%s", err, out)
	}
	out, err = kubectlErasure(t, e.ns, "receipt", "forget")
	if err != nil || !strings.Contains(out, `"payloadType": "application/vnd.in-toto+json"`) {
		t.Fatalf("receipt: %v\n%s", err, out)
	}

	// The API server refuses an edited history entry (S5)...
	edited := er.DeepCopy()
	edited.Status.History[1].Phase = lethev1.PhaseCancelled
	if err := k8s.Status().Update(context.Background(), edited); err == nil {
		t.Fatal("the API server accepted an edited history entry")
	}
	// ...and what it lets through (the receipt) is caught by verify.
	altered := er.DeepCopy()
	altered.Status.Receipt.Digest = altered.Status.History[0].Digest
	if err := k8s.Status().Update(context.Background(), altered); err != nil {
		t.Fatal(err)
	}
	out, err = kubectlErasure(t, e.ns, "verify", "forget")
	var exit *erasurecli.ExitError
	if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), "does NOT verify") {
		t.Fatalf("verify of an altered receipt: %v\n%s", err, out)
	}
}

func TestPluginCancelsDuringTheGracePeriod(t *testing.T) {
	e := newMemoryEnv(t, "plugin-cancel")
	if out, err := kubectlErasure(t, e.ns, "create", "oops", "--store", e.store.Name, "--session-id", keptB); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	er := &lethev1.ErasureRequest{}
	er.Namespace, er.Name = e.ns, "oops"
	waitPhase(t, er, lethev1.PhaseTombstoned)
	if out, err := kubectlErasure(t, e.ns, "cancel", "oops"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	waitPhase(t, er, lethev1.PhaseCancelled)
	if n := e.sessionRows(t, keptB); n == 0 {
		t.Fatal("the cancelled session's rows are gone")
	}
}
