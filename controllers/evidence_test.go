package controllers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/erasurecli"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/evidence/auditref"
	"github.com/lethe-dev/lethe/internal/fixture"
)

// completedWithLog waits until the request completed and its receipt's
// place in the store's log is in its status.
func completedWithLog(t *testing.T, er *lethev1.ErasureRequest) {
	t.Helper()
	waitPhase(t, er, lethev1.PhaseBackupsRotated)
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if r := er.Status.Receipt; r == nil || r.Log == nil {
			return errors.New("no receipt log inclusion yet")
		}
		return nil
	})
}

// noClusterCommand runs the plugin with a kubeconfig naming an API server
// that does not exist: what it does, it does with no cluster.
func noClusterCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return pluginIn(t, kubeconfigFor(t, &rest.Config{Host: "https://127.0.0.1:1", BearerToken: "none"}), args...)
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A real completed request: every digest recomputes with the independent
// implementation from the API server's own JSON; the exported bundle
// verifies with no cluster against the key set the auditor saved, and
// each tampering of it fails naming what is wrong.
func TestEvidenceRecomputesAndTheBundleVerifiesWithNoCluster(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "evidence")
	er := e.request(t, "forget", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA} })
	other := e.request(t, "other", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA2} })
	completedWithLog(t, er)
	completedWithLog(t, other)

	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(lethev1.GroupVersion.WithKind("ErasureRequest"))
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), u); err != nil {
		t.Fatal(err)
	}
	raw, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := auditref.Recompute(raw)
	if err != nil {
		t.Fatal(err)
	}
	h := er.Status.History
	for i := range h {
		if ref.EntryDigests[i] != h[i].Digest {
			t.Fatalf("entry %d: the independent implementation computes %s, Lethe wrote %s", i, ref.EntryDigests[i], h[i].Digest)
		}
	}
	if ref.EvidenceDigest != h[len(h)-1].EvidenceDigest {
		t.Fatalf("evidence document: the independent implementation computes %s, Lethe wrote %s", ref.EvidenceDigest, h[len(h)-1].EvidenceDigest)
	}

	out, err := kubectlErasure(t, e.ns, "verify", "forget")
	if err != nil || !strings.Contains(out, "receipt log holds the receipt") || !strings.Contains(out, "every entry is signed") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	bundleJSON, _, err := kubectlErasureCtx(ctx, t, e.ns, "export", "forget")
	if err != nil {
		t.Fatal(err)
	}
	ksJSON, err := json.Marshal(publishedKeySet(t))
	if err != nil {
		t.Fatal(err)
	}
	keySetFile := writeFile(t, "keyset.json", ksJSON)
	bundleFile := writeFile(t, "bundle.json", []byte(bundleJSON))
	out, err = noClusterCommand(t, "verify", "--bundle", bundleFile, "--key-set", keySetFile)
	if err != nil || !strings.Contains(out, "verified") || strings.Contains(out, "not pinned") {
		t.Fatalf("verify --bundle with no cluster: %v\n%s", err, out)
	}
	// Unpinned, it verifies against the bundle's own key set and says so.
	if out, err = noClusterCommand(t, "verify", "--bundle", bundleFile); err != nil || !strings.Contains(out, "not pinned") {
		t.Fatalf("verify --bundle unpinned: %v\n%s", err, out)
	}
	html, err := noClusterCommand(t, "report", "--bundle", bundleFile, "--key-set", keySetFile)
	if err != nil || !strings.Contains(html, string(er.UID)) || !strings.Contains(html, "Verified") {
		t.Fatalf("report --bundle with no cluster: %v\n%.400s", err, html)
	}

	otherBundle, _, err := kubectlErasureCtx(ctx, t, e.ns, "export", "other")
	if err != nil {
		t.Fatal(err)
	}
	assertBundleTamperingNamed(t, bundleJSON, otherBundle, keySetFile)
}

// assertBundleTamperingNamed edits the bundle as a forger would and checks
// that verify --bundle fails naming the edit.
func assertBundleTamperingNamed(t *testing.T, bundleJSON, otherJSON, keySetFile string) {
	t.Helper()
	read := func(s string) *evidence.Bundle {
		b, err := evidence.ReadBundle([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	forgerKey, err := evidence.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	deleted := func(b *evidence.Bundle) *lethev1.StepEvidence {
		for i := range b.Request.Status.Evidence.Steps {
			if s := &b.Request.Status.Evidence.Steps[i]; s.Step == lethev1.ConditionDeleted {
				return s
			}
		}
		t.Fatal("no Deleted step evidence")
		return nil
	}
	for name, tc := range map[string]struct {
		tamper func(b *evidence.Bundle)
		want   string
	}{
		"edited evidence count":      {func(b *evidence.Bundle) { deleted(b).Counts[0].Rows += 10 }, "evidence of step Deleted was edited"},
		"edited verification result": {func(b *evidence.Bundle) { deleted(b).Verification[0].Found = 3 }, "evidence of step Deleted was edited"},
		"edited plan":                {func(b *evidence.Bundle) { b.Request.Status.Plan.SessionsFound++ }, "status.plan was edited"},
		"forged entry appended without the key": {func(b *evidence.Bundle) {
			c := evidence.ChainOf(b.Request)
			c.Append(lethev1.PhaseBackupsRotated, lethev1.ReasonResurrected, time.Now(), evidence.Head(c.History), forgerKey)
			b.Request.Status.History = c.History
		}, "not in the key set"},
		"swapped receipt": {func(b *evidence.Bundle) { b.Request.Status.Receipt = read(otherJSON).Request.Status.Receipt },
			"which no history entry has"},
	} {
		t.Run(name, func(t *testing.T) {
			b := read(bundleJSON)
			tc.tamper(b)
			raw, err := json.Marshal(b)
			if err != nil {
				t.Fatal(err)
			}
			// The forger's key set inside the bundle does not help: the
			// auditor pins the one saved from the cluster.
			out, err := noClusterCommand(t, "verify", "--bundle", writeFile(t, "tampered.json", raw), "--key-set", keySetFile)
			var exit *erasurecli.ExitError
			if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v (want exit 1 naming %q)\n%s", err, tc.want, out)
			}
		})
	}
}

// The database keeps the proof of a request whose object is gone, and its
// receipt log: `receipts --store` verifies both. A receipt removed from the
// log (its proof and leaf deleted, the log renumbered, the recorded
// checkpoints dropped) is caught three ways: the manager refuses to sign a
// checkpoint of the shortened log (a live request holds an older one);
// `receipts` finds the live requests' checkpoints inconsistent; and the
// checkpoint the auditor held fails its consistency proof.
func TestReceiptLogCatchesARemovedReceipt(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "receipts")
	first := e.request(t, "first", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA} })
	completedWithLog(t, first)
	second := e.request(t, "second", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA2} })
	completedWithLog(t, second)
	deleteAndWaitGone(t, first)

	held := filepath.Join(t.TempDir(), "checkpoint")
	out, err := kubectlErasure(t, e.ns, "receipts", "--store", e.store.Name, "--save-checkpoint", held)
	if err != nil || !strings.Contains(out, string(first.UID)) || !strings.Contains(out, "gone") || !strings.Contains(out, "verified") {
		t.Fatalf("receipts: %v\n%s", err, out)
	}
	if _, err := os.Stat(held); err != nil {
		t.Fatalf("no checkpoint saved: %v", err)
	}
	// The forger, with the database's owner rights, removes the first receipt.
	for _, stmt := range []string{
		`DELETE FROM lethe.erasure_proofs WHERE request_uid = '` + string(first.UID) + `'`,
		`DELETE FROM lethe.receipt_log WHERE request_uid = '` + string(first.UID) + `'`,
		`UPDATE lethe.receipt_log SET idx = idx - 1`,
		`DELETE FROM lethe.receipt_log_checkpoints`,
	} {
		if _, err := e.conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	// The store's audit sees it at once: the second request holds a
	// checkpoint of the full log.
	waitCondition(t, e.store, lethev1.MemoryStoreReceiptLogConsistent, metav1.ConditionFalse, lethev1.ReasonReceiptLogInconsistent)
	// The next request completes, but the manager signs no checkpoint of
	// the shortened log.
	third := e.request(t, "third", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{keptB} })
	waitPhase(t, third, lethev1.PhaseBackupsRotated)
	eventually(t, 30*time.Second, func() error {
		if requestEvents(t, third, controllers.ReasonReceiptLogInconsistent) == 0 {
			return errors.New("no ReceiptLogInconsistent event")
		}
		return nil
	})
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(third), third); err != nil || third.Status.Receipt.Log != nil {
		t.Fatalf("the shortened log was signed: %v %+v", err, third.Status.Receipt)
	}
	var exit *erasurecli.ExitError
	out, err = kubectlErasure(t, e.ns, "receipts", "--store", e.store.Name)
	if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), "receipt log") {
		t.Fatalf("receipts after a removal: %v\n%s", err, out)
	}
	// Once no live request holds a checkpoint of the full log, the manager
	// signs the shortened one, and on its own the log verifies: only the
	// checkpoint the auditor held shows, by its consistency proof, that a
	// receipt was removed.
	deleteAndWaitGone(t, second)
	completedWithLog(t, third)
	if out, err = kubectlErasure(t, e.ns, "receipts", "--store", e.store.Name); err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("the shortened, re-signed log on its own: %v\n%s", err, out)
	}
	out, err = kubectlErasure(t, e.ns, "receipts", "--store", e.store.Name, "--checkpoint", held)
	if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), "consistency proof from the checkpoint in") {
		t.Fatalf("a removed receipt against the held checkpoint: %v\n%s", err, out)
	}
}

// An old receipt still verifies after the signing key is replaced: the
// key set keeps the old key, retired, and the new key signs what follows.
func TestOldReceiptVerifiesAfterKeyRotation(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "rotation")
	before := e.request(t, "before", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA} })
	completedWithLog(t, before)
	oldKeyID := before.Status.Receipt.KeyID

	newKeyID := rotateReceiptKey(t)
	// The manager reads its key at most KeyCacheTTL apart: once it has
	// published the new key as current, what it signs next is signed by it.
	eventually(t, 20*time.Second, func() error {
		ks := publishedKeySet(t)
		if cur := ks.Keys[len(ks.Keys)-1]; cur.KeyID != newKeyID || cur.ValidUntil != nil {
			return fmt.Errorf("the current published key is %s, not the new %s", cur.KeyID, newKeyID)
		}
		return nil
	})
	after := e.request(t, "after", func(o *lethev1.ErasureRequest) { o.Spec.SessionIDs = []lethev1.SessionID{erasedA2} })
	completedWithLog(t, after)
	eventually(t, 20*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(after), after); err != nil {
			return err
		}
		if after.Status.Receipt.KeyID != newKeyID || after.Status.History[0].KeyID != newKeyID {
			return fmt.Errorf("the new request was not signed with the new key %s: receipt %s, first entry %s", newKeyID, after.Status.Receipt.KeyID, after.Status.History[0].KeyID)
		}
		return nil
	})
	ks := publishedKeySet(t)
	if oldKeyID == newKeyID {
		t.Fatal("the rotation did not change the key")
	}
	old := ks.Lookup(oldKeyID)
	if len(old) == 0 || old[0].ValidUntil == nil {
		t.Fatalf("the key set does not keep the old key retired: %+v", ks)
	}
	for _, name := range []string{"before", "after"} {
		out, err := kubectlErasure(t, e.ns, "verify", name)
		if err != nil || !strings.Contains(out, "verified") {
			t.Fatalf("verify %s after the rotation: %v\n%s", name, err, out)
		}
	}
}

// rotateReceiptKey replaces the signing key's Secret with a new key (the
// Secret is immutable: replaced, never edited).
func rotateReceiptKey(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	secret := &corev1.Secret{}
	if err := k8s.Get(ctx, receiptKeySecret, secret); err != nil {
		t.Fatal(err)
	}
	pemKey, err := evidence.GeneratePrivateKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	key, err := evidence.ParsePrivateKey(pemKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	fresh := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name},
		Data: map[string][]byte{controllers.ReceiptPrivateKey: pemKey}}
	eventually(t, 10*time.Second, func() error { return k8s.Create(ctx, fresh) })
	return key.ID()
}

// kubeconfigFor writes a kubeconfig for the API server of cfg.
func kubeconfigFor(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// pluginIn runs the plugin against the API server of a kubeconfig.
func pluginIn(t *testing.T, kubeconfigPath string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := erasurecli.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfigPath))
	err := cmd.ExecuteContext(context.Background())
	return out.String() + errOut.String(), err
}

// The proof outlives the cluster: a request completed on a control plane
// of its own is exported, the manager and the API server are stopped, and
// the bundle still verifies (and renders) against the saved key set.
func TestBundleVerifiesAfterTheAPIServerStops(t *testing.T) {
	ctx := context.Background()
	own := startOwnCluster(t)
	c := own.c
	ns := newNamespaceIn(t, c, "bundle")
	dsn := migratedDatabase(t)
	if err := fixture.Seed(ctx, connectVector(t, dsn), fixture.Session{ID: erasedA, Tenant: "default", Rounds: 2, Text: "x"}); err != nil {
		t.Fatal(err)
	}
	createSecretIn(t, c, ns, "pg", map[string]string{"dsn": dsn})
	store := newStore(ns, nil)
	if err := c.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	er := &lethev1.ErasureRequest{ObjectMeta: metav1.ObjectMeta{Name: "forget", Namespace: ns},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: store.Name},
			SessionIDs: []lethev1.SessionID{erasedA}, Immediate: true, Reason: "DPO-9"}}
	if err := c.Create(ctx, er); err != nil {
		t.Fatal(err)
	}
	waitPhaseIn(t, c, er, lethev1.PhaseBackupsRotated)
	eventually(t, 30*time.Second, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
			return err
		}
		if er.Status.Receipt == nil || er.Status.Receipt.Log == nil {
			return errors.New("no receipt log inclusion yet")
		}
		return nil
	})
	kc := kubeconfigFor(t, own.cp.Config)
	bundle, err := pluginIn(t, kc, "export", "forget", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, receiptKeySecret, cm); err != nil {
		t.Fatal(err)
	}
	keySetFile := writeFile(t, "keyset.json", []byte(cm.Data[controllers.ReceiptKeySet]))
	bundleFile := writeFile(t, "bundle.json", []byte(bundle))

	if err := own.stop(); err != nil {
		t.Fatal(err)
	}
	if out, err := pluginIn(t, kc, "verify", "forget", "-n", ns); err == nil {
		t.Fatalf("online verify with the API server stopped: %s", out)
	}
	out, err := pluginIn(t, kc, "verify", "--bundle", bundleFile, "--key-set", keySetFile)
	if err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("verify --bundle with the API server stopped: %v\n%s", err, out)
	}
	html, err := pluginIn(t, kc, "report", "--bundle", bundleFile, "--key-set", keySetFile)
	if err != nil || !strings.Contains(html, "Certificate of erasure") || strings.Contains(html, "NOT VERIFIED") {
		t.Fatalf("report --bundle with the API server stopped: %v\n%.300s", err, html)
	}
}

// The manager signs only evidence it wrote and skips a step only when its
// signed milestone is there: a status writer who edits settled evidence or
// marks a step done during the grace period stops the request
// (EvidenceTampered) instead of having the edit signed.
func TestTamperedStatusIsNeverSigned(t *testing.T) {
	ctx := context.Background()
	e := newMemoryEnv(t, "tampered")
	for name, tamper := range map[string]func(er *lethev1.ErasureRequest){
		"settled evidence edited": func(er *lethev1.ErasureRequest) {
			er.Status.Evidence.Steps[0].Counts[0].Rows += 100
		},
		"a step marked done without its milestone": func(er *lethev1.ErasureRequest) {
			meta.SetStatusCondition(&er.Status.Conditions, metav1.Condition{Type: lethev1.ConditionGracePeriodElapsed,
				Status: metav1.ConditionTrue, Reason: lethev1.ReasonGraceElapsed, Message: "forged", ObservedGeneration: er.Generation})
		},
		"a step's evidence added out of turn": func(er *lethev1.ErasureRequest) {
			er.Status.Evidence.Steps = append(er.Status.Evidence.Steps, lethev1.StepEvidence{Step: lethev1.ConditionDeleted,
				Counts: []lethev1.TableCount{{Table: "memory.rounds", Rows: 5}}})
		},
	} {
		t.Run(name, func(t *testing.T) {
			er := e.request(t, "t-"+strings.Trim(strings.Map(func(r rune) rune {
				if r >= 'a' && r <= 'z' {
					return r
				}
				return '-'
			}, name), "-"), func(r *lethev1.ErasureRequest) {
				r.Spec.SessionIDs = []lethev1.SessionID{erasedA}
				r.Spec.Immediate, r.Spec.Reason = false, ""
				r.Spec.GracePeriod = &metav1.Duration{Duration: time.Hour}
			})
			waitStepReason(t, er, lethev1.ConditionGracePeriodElapsed, lethev1.ReasonWaitingForGrace)
			entries := len(er.Status.History)
			tamper(er)
			if err := k8s.Status().Update(ctx, er); err != nil {
				t.Fatal(err)
			}
			// A spec change starts a pass (a status write does not); the
			// cancel is not honoured either: nothing more is signed.
			patch := client.MergeFrom(er.DeepCopy())
			er.Spec.Cancel = true
			if err := k8s.Patch(ctx, er, patch); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, func() error {
				if requestEvents(t, er, controllers.ReasonEvidenceTampered) == 0 {
					return errors.New("no EvidenceTampered event")
				}
				return nil
			})
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), er); err != nil {
				t.Fatal(err)
			}
			if len(er.Status.History) != entries {
				t.Fatalf("the manager appended to a tampered history: %d entries, had %d", len(er.Status.History), entries)
			}
		})
	}
}
