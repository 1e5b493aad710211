package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	velerocrds "github.com/vmware-tanzu/velero/config/crd/v1/crds"
	velerov2alpha1crds "github.com/vmware-tanzu/velero/config/crd/v2alpha1/crds"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
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

// VeleroCRDs returns Velero's CRDs as Velero's own Go packages ship them
// (github.com/vmware-tanzu/velero/config/crd/v1/crds and v2alpha1/crds: the
// server refuses to start without both), compiled into the binary: nothing is
// looked up in the Go module cache at run time. Each call returns fresh
// copies, since installing a CRD fills in its fields.
func VeleroCRDs() []*apiextensionsv1.CustomResourceDefinition {
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(velerocrds.CRDs)+len(velerov2alpha1crds.CRDs))
	for _, crd := range append(slices.Clone(velerocrds.CRDs), velerov2alpha1crds.CRDs...) {
		out = append(out, crd.DeepCopy())
	}
	return out
}

// InstallVeleroCRDs installs Velero's CRDs into a running control plane and
// waits until the API server serves them.
func InstallVeleroCRDs(cfg *rest.Config) error {
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: VeleroCRDs()}); err != nil {
		return fmt.Errorf("install velero CRDs: %w", err)
	}
	return nil
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
	// watchdog stops the servers if the test binary dies first (orphans.go).
	watchdog *watchdog
}

// ControlPlaneOptions says which CRDs a control plane starts with.
type ControlPlaneOptions struct {
	// CRDDirs are folders of CRD manifests (Lethe's: LetheCRDDir).
	CRDDirs []string
	// Velero installs Velero's CRDs from its Go package.
	Velero bool
}

// StartControlPlane starts kube-apiserver and etcd with the given CRD folders installed.
func StartControlPlane(crdDirs ...string) (*ControlPlane, error) {
	return StartControlPlaneWith(ControlPlaneOptions{CRDDirs: crdDirs})
}

// StartControlPlaneWith starts kube-apiserver and etcd with the CRDs the options name installed.
func StartControlPlaneWith(o ControlPlaneOptions) (*ControlPlane, error) {
	assets := KubeAssets()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, missing(b, filepath.Join(assets, b), "envtest-assets")
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     o.CRDDirs,
		ErrorIfCRDPathMissing: true,
	}
	if o.Velero {
		env.CRDs = VeleroCRDs()
	}
	before, err := children(os.Getpid(), assets)
	if err != nil {
		return nil, err
	}
	cfg, err := env.Start()
	if err != nil {
		// envtest leaves the servers running when, say, a CRD is refused.
		_ = env.Stop()
		return nil, fmt.Errorf("start envtest control plane: %w", err)
	}
	cp := env.ControlPlane
	dog, err := watchChildren(assets, before, []string{cp.Etcd.DataDir, cp.APIServer.CertDir})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &ControlPlane{Env: env, Config: cfg, watchdog: dog}, nil
}

// Stop stops the control plane (envtest stops each process by its PID).
func (c *ControlPlane) Stop() error {
	if c == nil {
		return nil
	}
	c.watchdog.stop()
	return c.Env.Stop()
}
