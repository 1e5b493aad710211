package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lethe-dev/lethe/controllers"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// keyEnv is a control plane with a namespace for the key and a recorder
// writing Events through the events API, as the manager's does.
type keyEnv struct {
	cp       *testenv.ControlPlane
	c        client.Client
	recorder events.EventRecorder
}

func startKeyEnv(t *testing.T, crdDirs ...string) *keyEnv {
	t.Helper()
	cp, err := testenv.StartControlPlane(crdDirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	ctx, cancel := context.WithCancel(context.Background())
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); b.Shutdown() })
	for _, ns := range []string{"lethe-system", "other"} {
		if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	return &keyEnv{cp: cp, c: c, recorder: b.NewRecorder(scheme, "lethe-receipt-key")}
}

func (e *keyEnv) setup(nn types.NamespacedName, create bool) *controllers.ReceiptKeySetup {
	return &controllers.ReceiptKeySetup{Client: e.c, Reader: e.c, Recorder: e.recorder, Secret: nn, Create: create}
}

// published checks that the ConfigMap holds the public key of the Secret's
// private key, and returns the key ID.
func (e *keyEnv) published(t *testing.T, nn types.NamespacedName) (pemKey []byte, keyID string) {
	t.Helper()
	ctx := context.Background()
	s := &corev1.Secret{}
	if err := e.c.Get(ctx, nn, s); err != nil {
		t.Fatal(err)
	}
	key, err := evidence.ParsePrivateKey(s.Data[controllers.ReceiptPrivateKey])
	if err != nil {
		t.Fatalf("the Secret's key does not parse: %v", err)
	}
	pub, _ := key.PublicKeyPEM()
	cm := &corev1.ConfigMap{}
	if err := e.c.Get(ctx, nn, cm); err != nil {
		t.Fatalf("public key ConfigMap: %v", err)
	}
	if cm.Data[controllers.ReceiptPublicKey] != string(pub) || cm.Data["key-id"] != key.ID() {
		t.Fatalf("ConfigMap %v does not publish the Secret's key %s", cm.Data, key.ID())
	}
	return s.Data[controllers.ReceiptPrivateKey], key.ID()
}

// eventsOn lists the events.k8s.io Events regarding the Secret with reason.
func (e *keyEnv) eventsOn(t *testing.T, nn types.NamespacedName, reason string) int {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := e.c.List(context.Background(), list, client.InNamespace(nn.Namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range list.Items {
		if ev.Regarding.Kind == "Secret" && ev.Regarding.Name == nn.Name && ev.Reason == reason {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("%s: not after %s", what, timeout)
}

func TestReceiptKeyIsCreatedOnceReusedAndNeverOverwritten(t *testing.T) {
	e := startKeyEnv(t)
	ctx := context.Background()
	nn := types.NamespacedName{Namespace: "lethe-system", Name: "lethe-receipt-key"}

	// First start: no Secret, so one is created, published and announced.
	id1, created, err := e.setup(nn, true).Ensure(ctx)
	if err != nil || !created {
		t.Fatalf("first Ensure: created=%v err=%v", created, err)
	}
	pem1, pubID := e.published(t, nn)
	if pubID != id1 {
		t.Fatalf("Ensure returned key %s, the ConfigMap publishes %s", id1, pubID)
	}
	waitFor(t, "a ReceiptKeyCreated Event on the Secret", 10*time.Second, func() bool {
		return e.eventsOn(t, nn, controllers.ReasonReceiptKeyCreated) == 1
	})

	// Restart (a new setup, as a new process has): the same key is used.
	id2, created, err := e.setup(nn, true).Ensure(ctx)
	if err != nil || created || id2 != id1 {
		t.Fatalf("restart: created=%v id=%s (first %s) err=%v", created, id2, id1, err)
	}
	if pem2, _ := e.published(t, nn); !bytes.Equal(pem1, pem2) {
		t.Fatal("a restart changed the key")
	}
	time.Sleep(500 * time.Millisecond) // give a wrong second Event time to arrive
	if n := e.eventsOn(t, nn, controllers.ReasonReceiptKeyCreated); n != 1 {
		t.Fatalf("%d ReceiptKeyCreated Events after a restart, want 1", n)
	}

	// An existing Secret the user made is used as it is; one that holds no
	// usable key is reported, never replaced.
	mine, _ := evidence.GeneratePrivateKeyPEM()
	theirs := types.NamespacedName{Namespace: "other", Name: "their-key"}
	if err := e.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: theirs.Namespace, Name: theirs.Name},
		Data: map[string][]byte{controllers.ReceiptPrivateKey: mine}}); err != nil {
		t.Fatal(err)
	}
	if _, created, err := e.setup(theirs, true).Ensure(ctx); err != nil || created {
		t.Fatalf("existing Secret: created=%v err=%v", created, err)
	}
	if got, _ := e.published(t, theirs); !bytes.Equal(got, mine) {
		t.Fatal("an existing key was replaced")
	}
	broken := types.NamespacedName{Namespace: "other", Name: "broken-key"}
	junk := map[string][]byte{controllers.ReceiptPrivateKey: []byte("not a key")}
	if err := e.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: broken.Namespace, Name: broken.Name}, Data: junk}); err != nil {
		t.Fatal(err)
	}
	s := e.setup(broken, true)
	for range 2 {
		if _, created, err := s.Ensure(ctx); err == nil || created {
			t.Fatalf("unusable key: created=%v err=%v, want an error", created, err)
		}
	}
	got := &corev1.Secret{}
	if err := e.c.Get(ctx, broken, got); err != nil || !bytes.Equal(got.Data[controllers.ReceiptPrivateKey], junk[controllers.ReceiptPrivateKey]) {
		t.Fatalf("an unusable Secret was changed: %v %q", err, got.Data)
	}
	waitFor(t, "one ReceiptKeyInvalid Event", 10*time.Second, func() bool {
		return e.eventsOn(t, broken, controllers.ReasonReceiptKeyInvalid) == 1
	})

	// --receipt-key-create=false: nothing is created.
	off := types.NamespacedName{Namespace: "lethe-system", Name: "not-created"}
	if _, created, err := e.setup(off, false).Ensure(ctx); err == nil || created {
		t.Fatalf("create off: created=%v err=%v, want an error", created, err)
	}
	if err := e.c.Get(ctx, off, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("create off made the Secret: %v", err)
	}
}

// Two managers starting at once (two replicas) end with one key.
func TestReceiptKeyRaceEndsWithOneKey(t *testing.T) {
	e := startKeyEnv(t)
	nn := types.NamespacedName{Namespace: "lethe-system", Name: "raced"}
	ids := make([]string, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() { ids[i], _, errs[i] = e.setup(nn, true).Ensure(context.Background()) })
	}
	wg.Wait()
	_, want := e.published(t, nn)
	for i := range ids {
		if errs[i] != nil || ids[i] != want {
			t.Errorf("manager %d: key %s err %v, want key %s", i, ids[i], errs[i], want)
		}
	}
}

// The manager binary, started with the chart's way of naming the Secret,
// creates the key, and a restarted manager keeps it.
func TestManagerBinaryCreatesTheReceiptKeyAndKeepsItOnRestart(t *testing.T) {
	crds, err := testenv.LetheCRDDir()
	if err != nil {
		t.Fatal(err)
	}
	e := startKeyEnv(t, crds)
	dir := t.TempDir()
	bin, err := testenv.BuildManager(dir)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := e.cp.WriteKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	nn := types.NamespacedName{Namespace: "lethe-system", Name: "lethe-receipt-key"}
	logPath := filepath.Join(dir, "manager.log")
	// run starts the manager and stops it once its log says want.
	run := func(want string) {
		before, _ := os.ReadFile(logPath)
		m, err := testenv.StartManager(bin, kubeconfig, logPath, "--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:0",
			"--receipt-key-secret="+nn.String())
		if err != nil {
			t.Fatal(err)
		}
		defer m.Stop(10 * time.Second)
		waitFor(t, "the manager's log line "+want, 60*time.Second, func() bool {
			out, _ := os.ReadFile(logPath)
			if done, err := m.Exited(); done {
				t.Fatalf("manager exited: %v\n%s", err, out)
			}
			return bytes.Contains(out[len(before):], []byte(want))
		})
	}
	run("created the receipt signing key")
	pem1, id1 := e.published(t, nn)
	run("receipts are signed with the existing key")
	pem2, id2 := e.published(t, nn)
	if !bytes.Equal(pem1, pem2) {
		t.Fatalf("the restarted manager changed the key (%s → %s)", id1, id2)
	}
	out, _ := os.ReadFile(logPath)
	if n := bytes.Count(out, []byte("created the receipt signing key")); n != 1 {
		t.Errorf("the key was created %d times", n)
	}
	waitFor(t, fmt.Sprintf("the manager's %s Event", controllers.ReasonReceiptKeyCreated), 10*time.Second, func() bool {
		return e.eventsOn(t, nn, controllers.ReasonReceiptKeyCreated) == 1
	})
}
