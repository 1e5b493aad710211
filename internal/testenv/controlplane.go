package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeAssets is the folder with kube-apiserver and etcd ($KUBEBUILDER_ASSETS,
// default bin/k8s).
func KubeAssets() string {
	if v := os.Getenv("KUBEBUILDER_ASSETS"); v != "" {
		return v
	}
	root, err := RepoRoot()
	if err != nil {
		return "bin/k8s"
	}
	return filepath.Join(root, "bin", "k8s")
}

// VeleroCRDDir is where the velero Go module ships its CRDs.
func VeleroCRDDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/vmware-tanzu/velero")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate the velero module (go mod download): %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "v1", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("velero CRDs not found at %s: %w", dir, err)
	}
	return dir, nil
}

// LetheCRDDir is config/crd/bases of this repository.
func LetheCRDDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "config", "crd", "bases"), nil
}

// ControlPlane is a running kube-apiserver and etcd.
type ControlPlane struct {
	Env    *envtest.Environment
	Config *rest.Config
}

// StartControlPlane starts kube-apiserver and etcd with the given CRD folders installed.
func StartControlPlane(crdDirs ...string) (*ControlPlane, error) {
	assets := KubeAssets()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, missing(b, filepath.Join(assets, b), "envtest-assets")
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		// envtest leaves the servers running when, say, a CRD is refused.
		_ = env.Stop()
		return nil, fmt.Errorf("start envtest control plane: %w", err)
	}
	return &ControlPlane{Env: env, Config: cfg}, nil
}

// Stop stops the control plane (envtest stops each process by its PID).
func (c *ControlPlane) Stop() error {
	if c == nil {
		return nil
	}
	return c.Env.Stop()
}
