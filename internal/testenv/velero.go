package testenv

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/label"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// VeleroBucket is the bucket every Velero instance stores its backups in
// (each instance has an object store of its own).
const VeleroBucket = "velero"

// veleroLockFile serializes Velero servers on the host (across test
// binaries, the dev stack and benchmarks, whatever their $TMPDIR): Velero's
// controller framework binds :8080 on every interface, whatever its flags.
const veleroLockFile = "/tmp/lethe-velero-8080.lock"

// veleroLockWait bounds the wait for another Velero to stop.
const veleroLockWait = 30 * time.Minute

// Velero is a real, unmodified Velero server with the AWS object-store
// plugin, running as a host process against a test API server, and an
// S3-compatible server (gofakes3) holding its bucket in a fresh folder.
// Only one runs on a host at a time: StartVelero waits for the one before
// it to stop.
type Velero struct {
	// Namespace is the namespace the server works in; its
	// BackupStorageLocation "default" points at the bucket.
	Namespace string
	// Store is the object store's API.
	Store *ObjectStore

	dir    string
	args   []string
	env    []string
	server *process
	s3     *process
	lock   *os.File
	c      client.WithWatch
}

// VeleroOptions are what a Velero instance differs in.
type VeleroOptions struct {
	// Namespace Velero works in (default "velero"), created if missing.
	Namespace string
	// ConcurrentBackups is how many Backups Velero takes at once
	// (--concurrent-backups; 0: Velero's default, one).
	ConcurrentBackups int
}

// veleroBinaries are the server, its plugin and the object store's server:
// $LETHE_VELERO, $LETHE_VELERO_PLUGIN_AWS, $LETHE_GOFAKES3, else bin/.
func veleroBinaries() (server, plugin, s3 string, err error) {
	root, _ := RepoRoot()
	find := func(env, name string) (string, error) {
		p := envOr(env, filepath.Join(root, "bin", name))
		if _, err := os.Stat(p); err != nil {
			return "", missing(name, p, "velero")
		}
		return filepath.Abs(p)
	}
	if server, err = find("LETHE_VELERO", "velero"); err != nil {
		return "", "", "", err
	}
	if plugin, err = find("LETHE_VELERO_PLUGIN_AWS", "velero-plugin-for-aws"); err != nil {
		return "", "", "", err
	}
	s3, err = find("LETHE_GOFAKES3", "gofakes3")
	return server, plugin, s3, err
}

// StartVelero starts an object store with an empty bucket and a Velero
// server against the API server of cfg (installing Velero's CRDs if they
// are not there), and returns once its BackupStorageLocation is Available.
// It blocks while another Velero runs on this host.
func StartVelero(cfg *rest.Config, o VeleroOptions) (v *Velero, err error) {
	server, plugin, s3, err := veleroBinaries()
	if err != nil {
		return nil, err
	}
	if o.Namespace == "" {
		o.Namespace = "velero"
	}
	v = &Velero{Namespace: o.Namespace}
	defer func() {
		if err != nil {
			v.Stop()
			v = nil
		}
	}()
	if v.lock, err = lockExclusive(veleroLockFile); err != nil {
		return v, err
	}
	if err = portFree(8080); err != nil {
		return v, err
	}
	if v.dir, err = os.MkdirTemp("", "lethe-velero-"); err != nil {
		return v, err
	}
	if v.s3, v.Store, err = startObjectStore(s3, filepath.Join(v.dir, "s3")); err != nil {
		return v, err
	}
	if v.c, err = veleroClient(cfg); err != nil {
		return v, err
	}
	if err = v.prepareCluster(cfg, plugin); err != nil {
		return v, err
	}
	metrics, err := FreePort()
	if err != nil {
		return v, err
	}
	// Started by absolute path: Velero re-executes itself to run plugins.
	v.args = []string{server, "server", "--kubeconfig", filepath.Join(v.dir, "kubeconfig"), "--namespace", v.Namespace,
		"--plugin-dir", filepath.Join(v.dir, "plugins"), "--default-volumes-to-fs-backup=false",
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", metrics), "--profiler-address", "",
		"--garbage-collection-frequency", "1s", "--backup-sync-period", "1s", "--store-validation-frequency", "5s"}
	if o.ConcurrentBackups > 0 {
		v.args = append(v.args, fmt.Sprintf("--concurrent-backups=%d", o.ConcurrentBackups))
	}
	v.env = append(os.Environ(), "AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(v.dir, "credentials"), "TMPDIR="+filepath.Join(v.dir, "tmp"))
	return v, v.launch()
}

// prepareCluster writes Velero's kubeconfig, credentials and plugin folder,
// and creates its CRDs, namespace and BackupStorageLocation.
func (v *Velero) prepareCluster(cfg *rest.Config, plugin string) error {
	for _, d := range []string{"plugins", "tmp"} {
		if err := os.MkdirAll(filepath.Join(v.dir, d), 0o700); err != nil {
			return err
		}
	}
	if err := os.Symlink(plugin, filepath.Join(v.dir, "plugins", "velero-plugin-for-aws")); err != nil {
		return err
	}
	// gofakes3 checks no signature; the plugin needs some credentials.
	creds := "[default]\naws_access_key_id = lethe-test\naws_secret_access_key = lethe-test\n"
	if err := os.WriteFile(filepath.Join(v.dir, "credentials"), []byte(creds), 0o600); err != nil {
		return err
	}
	if err := writeKubeconfig(cfg, filepath.Join(v.dir, "kubeconfig")); err != nil {
		return err
	}
	if err := InstallVeleroCRDs(cfg); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v.Namespace}}
	if err := v.c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", v.Namespace, err)
	}
	bsl := &velerov1.BackupStorageLocation{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: v.Namespace},
		Spec: velerov1.BackupStorageLocationSpec{
			Provider: "aws", Default: true,
			StorageType: velerov1.StorageType{ObjectStorage: &velerov1.ObjectStorageLocation{Bucket: VeleroBucket}},
			Config:      map[string]string{"region": "us-east-1", "s3ForcePathStyle": "true", "s3Url": v.Store.URL},
		},
	}
	if err := v.c.Create(ctx, bsl); err != nil {
		return fmt.Errorf("create BackupStorageLocation %s/default: %w", v.Namespace, err)
	}
	return nil
}

// launch starts the server and waits for its storage location to be Available.
func (v *Velero) launch() error {
	cmd := exec.Command(v.args[0], v.args[1:]...)
	cmd.Env = v.env
	// Its own process group: Stop signals the plugin processes it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The location's status a server before this one left says nothing:
	// ready is a validation by this one.
	launched := metav1.Now().Rfc3339Copy()
	proc, err := start("velero", cmd, syscall.SIGKILL)
	if err != nil {
		return err
	}
	v.server = proc
	return proc.waitFor(60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		bsl := &velerov1.BackupStorageLocation{}
		if err := v.c.Get(ctx, client.ObjectKey{Namespace: v.Namespace, Name: "default"}, bsl); err != nil {
			return err
		}
		if bsl.Status.Phase != velerov1.BackupStorageLocationPhaseAvailable {
			return fmt.Errorf("storage location phase %q: %s", bsl.Status.Phase, bsl.Status.Message)
		}
		if t := bsl.Status.LastValidationTime; t == nil || t.Before(&launched) {
			return fmt.Errorf("storage location not validated since the server started (last %v)", t)
		}
		return nil
	})
}

// Restart stops the server and starts it again, as a redeployed Velero
// would come back: its first sync of the bucket runs at once (the periodic
// one runs every minute whatever --backup-sync-period says).
func (v *Velero) Restart() error {
	v.stopServer()
	return v.launch()
}

// StopServer stops the Velero server only (an outage, an upgrade): its
// objects stay, nothing processes them until StartServer.
func (v *Velero) StopServer() { v.stopServer() }

// StartServer starts a stopped server again and waits until it is ready.
func (v *Velero) StartServer() error { return v.launch() }

// Log is what the server has written so far (for test failures).
func (v *Velero) Log() string {
	if v == nil || v.server == nil {
		return ""
	}
	return v.server.log.String()
}

// Stop stops the server (and its plugins), then the object store, removes
// their folder and lets the next Velero start.
func (v *Velero) Stop() {
	if v == nil {
		return
	}
	v.stopServer()
	v.s3.stop(syscall.SIGTERM, 5*time.Second)
	if v.dir != "" {
		_ = os.RemoveAll(v.dir)
	}
	if v.lock != nil {
		_ = v.lock.Close() // releases the flock
	}
}

func (v *Velero) stopServer() {
	if v.server == nil {
		return
	}
	pgid := v.server.cmd.Process.Pid
	if !v.server.exited() {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-v.server.done:
		case <-time.After(10 * time.Second):
		}
	}
	// The plugin processes are in the group: they go too, even when the
	// server itself had already died.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-v.server.done
}

// PauseObjectStore stops the object store's process (SIGSTOP, by PID):
// requests to it hang until ResumeObjectStore, as with a stalled upload.
func (v *Velero) PauseObjectStore() error { return v.s3.cmd.Process.Signal(syscall.SIGSTOP) }

// ResumeObjectStore continues a paused object store.
func (v *Velero) ResumeObjectStore() error { return v.s3.cmd.Process.Signal(syscall.SIGCONT) }

// lockExclusive takes an exclusive flock on path, waiting for its holder
// (named on stderr, once) up to veleroLockWait; it writes its own PID into
// the file. The lock is released when the file is closed or the process dies.
func lockExclusive(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("open the Velero lock %s: %w", path, err)
	}
	_ = f.Chmod(0o666) // other users' tests share it (the umask cut the mode)
	deadline := time.Now().Add(veleroLockWait)
	for said := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder, _ := os.ReadFile(path)
		if time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("another Velero (process %s, the dev stack or another test binary) held %s for %s; stop it (make dev-down) and run again",
				strings.TrimSpace(string(holder)), path, veleroLockWait)
		}
		if !said {
			said = true
			fmt.Fprintf(os.Stderr, "testenv: waiting for the Velero on this host (process %s, lock %s) to stop; only one runs at a time\n",
				strings.TrimSpace(string(holder)), path)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// portFree fails when something outside Lethe's tests holds the port.
func portFree(port int) error {
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("port %d is taken and Velero binds it unconditionally; stop what holds it: %w", port, err)
	}
	return l.Close()
}

func veleroClient(cfg *rest.Config) (client.WithWatch, error) {
	scheme := runtime.NewScheme()
	if err := errors.Join(corev1.AddToScheme(scheme), velerov1.AddToScheme(scheme)); err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme})
}

// writeKubeconfig writes a kubeconfig with cfg's server and credentials.
func writeKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

// Client reads and writes Velero's objects on the instance's API server.
func (v *Velero) Client() client.Client { return v.c }

// BackupOptions describe a Backup for Velero to take.
type BackupOptions struct {
	// Labels are set on the Backup (the store's backupSelector matches them).
	Labels map[string]string
	// Namespaces Velero backs up.
	Namespaces []string
	// Resources, when set, are the only resources Velero backs up in them
	// (each else costs Velero a list per Backup, of about 45 kinds).
	Resources []string
	// TTL sets the expiration Velero gives the Backup (default 720h).
	TTL time.Duration
}

// TakeBackup asks Velero for a Backup and returns it once Velero has started
// it (phase past New, start time set): Velero itself sets its start time and
// expiration. WaitBackup waits for it to complete.
func (v *Velero) TakeBackup(ctx context.Context, name string, o BackupOptions) (*velerov1.Backup, error) {
	if o.TTL == 0 {
		o.TTL = 720 * time.Hour
	}
	b := &velerov1.Backup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v.Namespace, Labels: o.Labels},
		Spec: velerov1.BackupSpec{IncludedNamespaces: o.Namespaces, IncludedResources: o.Resources, TTL: metav1.Duration{Duration: o.TTL},
			StorageLocation: "default", SnapshotVolumes: new(bool)},
	}
	if err := v.c.Create(ctx, b); err != nil {
		return nil, fmt.Errorf("create Backup %s/%s: %w", v.Namespace, name, err)
	}
	return v.waitBackup(ctx, name, func(b *velerov1.Backup) bool { return b.Status.StartTimestamp != nil })
}

// WaitBackup waits until Velero has finished the Backup and returns it; a
// Backup that ends in any phase but Completed is an error.
func (v *Velero) WaitBackup(ctx context.Context, name string) (*velerov1.Backup, error) {
	b, err := v.waitBackup(ctx, name, func(b *velerov1.Backup) bool {
		switch b.Status.Phase {
		case velerov1.BackupPhaseCompleted, velerov1.BackupPhaseFailed, velerov1.BackupPhasePartiallyFailed,
			velerov1.BackupPhaseFailedValidation:
			return true
		}
		return false
	})
	if err == nil && b.Status.Phase != velerov1.BackupPhaseCompleted {
		err = &BackupFailedError{Name: name, Phase: b.Status.Phase, Reason: b.Status.FailureReason,
			ValidationErrors: b.Status.ValidationErrors, Errors: b.Status.Errors, Log: v.logLines(name, 40)}
	}
	return b, err
}

// BackupFailedError is a Backup Velero finished in a phase other than
// Completed, with what Velero said about it.
type BackupFailedError struct {
	Name             string
	Phase            velerov1.BackupPhase
	Reason           string
	ValidationErrors []string
	Errors           int
	// Log is the server's last lines naming the Backup.
	Log string
}

func (e *BackupFailedError) Error() string {
	return fmt.Sprintf("backup %s ended %s (failure reason %q, validation errors %v, %d error(s)); Velero's log about it:\n%s",
		e.Name, e.Phase, e.Reason, e.ValidationErrors, e.Errors, e.Log)
}

// logLines is the server's last n log lines that contain s.
func (v *Velero) logLines(s string, n int) string {
	var lines []string
	for l := range strings.SplitSeq(v.Log(), "\n") {
		if strings.Contains(l, s) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// WaitBackupGone waits until the Backup object is gone (after DeleteBackup).
func (v *Velero) WaitBackupGone(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		err := v.c.Get(ctx, client.ObjectKey{Namespace: v.Namespace, Name: name}, &velerov1.Backup{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("backup %s still there after 2m (last error %w)", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DeleteBackup asks Velero to delete a Backup and its files, as an operator
// would (a DeleteBackupRequest), and returns the request without waiting:
// Velero removes the Backup, its files and then the request. A Backup
// already gone is not an error (nil request).
func (v *Velero) DeleteBackup(ctx context.Context, name string) (*velerov1.DeleteBackupRequest, error) {
	b := &velerov1.Backup{}
	if err := v.c.Get(ctx, client.ObjectKey{Namespace: v.Namespace, Name: name}, b); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	req := &velerov1.DeleteBackupRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-", Namespace: v.Namespace,
			Labels: map[string]string{velerov1.BackupNameLabel: label.GetValidName(name), velerov1.BackupUIDLabel: string(b.UID)}},
		Spec: velerov1.DeleteBackupRequestSpec{BackupName: name},
	}
	if err := v.c.Create(ctx, req); err != nil {
		return nil, fmt.Errorf("create a DeleteBackupRequest for %s/%s: %w", v.Namespace, name, err)
	}
	return req, nil
}

func (v *Velero) waitBackup(ctx context.Context, name string, done func(*velerov1.Backup) bool) (*velerov1.Backup, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// A watch from a list, not a read every 100 ms: a round of the history
	// checker waits for ten Backups at once, twice each.
	var last *velerov1.Backup
	var err error
	for ctx.Err() == nil {
		var found bool
		if found, err = v.followBackup(ctx, name, done, &last); found {
			return last, nil
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	phase := velerov1.BackupPhase("")
	if last != nil {
		phase = last.Status.Phase
	}
	return nil, fmt.Errorf("backup %s: phase %q after 2m (last error %w)\n%s", name, phase, cmp.Or(err, ctx.Err()), v.Log())
}

// followBackup lists the Backup, then watches it from the list until done
// holds for a version (true), the watch ends (false, nil: list again) or
// either fails; last is the latest version seen.
func (v *Velero) followBackup(ctx context.Context, name string, done func(*velerov1.Backup) bool, last **velerov1.Backup) (bool, error) {
	one := client.MatchingFields{"metadata.name": name}
	list := &velerov1.BackupList{}
	if err := v.c.List(ctx, list, client.InNamespace(v.Namespace), one); err != nil {
		return false, err
	}
	if len(list.Items) == 1 {
		if *last = &list.Items[0]; done(*last) {
			return true, nil
		}
	}
	w, err := v.c.Watch(ctx, &velerov1.BackupList{}, client.InNamespace(v.Namespace), one,
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return false, err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if b, ok := ev.Object.(*velerov1.Backup); ok && ev.Type != watch.Deleted {
			if *last = b; done(b) {
				return true, nil
			}
		}
	}
	return false, nil
}

// CopyBackupInBucket writes a copy of a Backup's files under another name
// into the bucket (its metadata renamed), as another cluster's Velero
// sharing the bucket would have left them; Velero's sync creates the Backup
// object. It is how a benchmark gets many real Backups without waiting for
// Velero to take each one.
func (v *Velero) CopyBackupInBucket(from, to string) error {
	keys, err := v.BackupFiles(from)
	if err != nil {
		return err
	}
	for _, k := range keys {
		data, err := v.Store.Get(VeleroBucket, k)
		if err != nil {
			return err
		}
		file := strings.TrimPrefix(k, "backups/"+from+"/")
		if file == "velero-backup.json" {
			if data, err = renamedBackupMetadata(data, to); err != nil {
				return err
			}
		}
		file = strings.Replace(file, from, to, 1)
		if err := v.Store.Put(VeleroBucket, "backups/"+to+"/"+file, data); err != nil {
			return err
		}
	}
	return nil
}

// renamedBackupMetadata is velero-backup.json for a Backup of another name.
func renamedBackupMetadata(data []byte, name string) ([]byte, error) {
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("read velero-backup.json: %w", err)
	}
	meta, ok := obj["metadata"].(map[string]any)
	if !ok {
		return nil, errors.New("velero-backup.json has no metadata")
	}
	meta["name"] = name
	delete(meta, "uid")
	delete(meta, "resourceVersion")
	return json.Marshal(obj)
}
