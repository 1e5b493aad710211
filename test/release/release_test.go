// Package release tests `make release` (hack/release.sh): it builds the
// artifacts into a temp dir and checks them as a user or a package index
// would: the archives' contents and build stamps, the checksums file, the
// krew manifest's checksums, the CycloneDX SBOMs, and the packaged chart
// installed into a test API server with helm.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/lethe-dev/lethe/internal/testenv"
)

const (
	module     = "github.com/lethe-dev/lethe"
	version    = "v0.2.0-rc.1"
	chartVer   = "0.2.0-rc.1"
	releaseURL = "https://downloads.example.invalid/lethe/v0.2.0-rc.1"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// tool is a pinned tool's path: from the variable the Makefile exports, or ./bin.
func tool(t *testing.T, envVar, name string) string {
	t.Helper()
	p := os.Getenv(envVar)
	if p == "" {
		p = filepath.Join(repoRoot(t), "bin", name)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not installed at %s: run `make %s` (make test-deps does)", name, p, name)
	}
	return p
}

// platforms is what the test builds: one platform by default (each one
// compiles every package anew); LETHE_RELEASE_PLATFORMS widens it.
func platforms() []string {
	if v := os.Getenv("LETHE_RELEASE_PLATFORMS"); v != "" {
		return strings.Fields(v)
	}
	return []string{"linux/amd64"}
}

func TestRelease(t *testing.T) {
	root := repoRoot(t)
	// The commit is read once and passed: the work tree may move on while the release builds.
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.TrimSpace(string(head))
	dist := filepath.Join(t.TempDir(), "dist")
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "release")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "VERSION="+version, "GIT_COMMIT="+commit, "DIST="+dist, "RELEASE_URL="+releaseURL,
		"RELEASE_PLATFORMS="+strings.Join(platforms(), " "),
		"LETHE_HELM="+tool(t, "LETHE_HELM", "helm"), "CYCLONEDX_GOMOD="+tool(t, "CYCLONEDX_GOMOD", "cyclonedx-gomod"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh: %v\n%s", err, out)
	}

	t.Run("archives", func(t *testing.T) { checkArchives(t, dist, commit) })
	t.Run("checksums", func(t *testing.T) { checkChecksums(t, dist) })
	t.Run("krew", func(t *testing.T) { checkKrew(t, dist) })
	t.Run("sbom", func(t *testing.T) {
		for _, p := range platforms() {
			suffix := "_" + version + "_" + strings.ReplaceAll(p, "/", "_") + ".cdx.json"
			checkSBOM(t, filepath.Join(dist, "manager"+suffix), "sigs.k8s.io/controller-runtime")
			checkSBOM(t, filepath.Join(dist, "kubectl-erasure"+suffix), "github.com/spf13/cobra")
		}
	})
	t.Run("chart", func(t *testing.T) { checkChartInstalls(t, filepath.Join(dist, "lethe-"+chartVer+".tgz")) })
}

// readArchive returns the files of a tar.gz by name.
func readArchive(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s owned by %d:%d, want 0:0", file, h.Name, h.Uid, h.Gid)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func checkArchives(t *testing.T, dist, commit string) {
	root := repoRoot(t)
	license, _ := os.ReadFile(filepath.Join(root, "LICENSE"))
	for _, p := range platforms() {
		goos, goarch, _ := strings.Cut(p, "/")
		for _, name := range []string{"kubectl-erasure", "manager"} {
			file := filepath.Join(dist, fmt.Sprintf("%s_%s_%s_%s.tar.gz", name, version, goos, goarch))
			files := readArchive(t, file)
			if got := slices.Sorted(func(yield func(string) bool) {
				for k := range files {
					if !yield(k) {
						return
					}
				}
			}); !slices.Equal(got, []string{"LICENSE", "README.md", name}) {
				t.Errorf("%s holds %v", file, got)
			}
			if len(license) == 0 || !bytes.Equal(files["LICENSE"], license) {
				t.Errorf("%s: LICENSE differs from the repository's", file)
			}
			bin := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(bin, files[name], 0o755); err != nil {
				t.Fatal(err)
			}
			info, err := buildinfo.ReadFile(bin)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			if info.Path != module+"/cmd/"+name || settings["GOOS"] != goos || settings["GOARCH"] != goarch ||
				settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
				t.Errorf("%s: built as %s %v", file, info.Path, settings)
			}
			// -trimpath keeps -ldflags out of the build info: the stamped
			// strings must be in the binary itself.
			for _, stamp := range []string{version, commit} {
				if !bytes.Contains(files[name], []byte(stamp)) {
					t.Errorf("%s: %s is not stamped into the binary", file, stamp)
				}
			}
			if goos == runtime.GOOS && goarch == runtime.GOARCH {
				checkVersionCommand(t, bin, commit)
			}
			if goos == "linux" {
				e, err := elf.Open(bin)
				if err != nil {
					t.Fatalf("%s: not an ELF binary: %v", file, err)
				}
				want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
				if e.Machine != want {
					t.Errorf("%s: machine %v, want %v", file, e.Machine, want)
				}
				_ = e.Close()
			}
		}
	}
}

// Each binary reports the version, commit and date the release stamped
// (`kubectl erasure version --client -o json`, `manager --version`).
func checkVersionCommand(t *testing.T, bin, commit string) {
	t.Helper()
	args := []string{"--version"}
	if filepath.Base(bin) == "kubectl-erasure" {
		args = []string{"version", "--client", "-o", "json"}
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	type info struct{ Version, GitCommit, BuildDate string }
	var v struct {
		info
		Client info `json:"clientVersion"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
	got := v.info
	if got.Version == "" {
		got = v.Client
	}
	if got.Version != version || got.GitCommit != commit || !strings.HasPrefix(got.BuildDate, "20") {
		t.Errorf("%s %v says %+v, want %s from %s", filepath.Base(bin), args, got, version, commit)
	}
}

func sha256File(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// checksums.txt lists every artifact (sha256sum format) with its true sum.
func checkChecksums(t *testing.T, dist string) {
	raw, err := os.ReadFile(filepath.Join(dist, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for line := range strings.Lines(string(raw)) {
		sum, name, ok := strings.Cut(strings.TrimSpace(line), "  ")
		if !ok {
			t.Fatalf("checksums.txt line %q is not in sha256sum format", line)
		}
		listed[name] = true
		if got := sha256File(t, filepath.Join(dist, name)); got != sum {
			t.Errorf("checksums.txt says %s for %s, the file's is %s", sum, name, got)
		}
	}
	err = filepath.WalkDir(dist, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dist, p)
		if rel != "checksums.txt" && !listed[rel] {
			t.Errorf("%s is not in checksums.txt", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := 4*len(platforms()) + 1 + 1; len(listed) != want { // archives and SBOMs, chart, krew manifest
		t.Errorf("checksums.txt lists %d files, want %d: %v", len(listed), want, listed)
	}
}

type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

// The krew manifest points each platform at its archive, with the archive's sha256.
func checkKrew(t *testing.T, dist string) {
	raw, err := os.ReadFile(filepath.Join(dist, "krew", "erasure.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(raw, &p); err != nil {
		t.Fatalf("the krew manifest does not parse: %v\n%s", err, raw)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "erasure" ||
		p.Spec.Version != "v"+chartVer || p.Spec.ShortDescription == "" || p.Spec.Description == "" || p.Spec.Homepage == "" {
		t.Errorf("krew manifest header: %+v", p)
	}
	if len(p.Spec.Platforms) != len(platforms()) {
		t.Fatalf("krew manifest has %d platforms, want %d", len(p.Spec.Platforms), len(platforms()))
	}
	for i, want := range platforms() {
		pl := p.Spec.Platforms[i]
		goos, goarch, _ := strings.Cut(want, "/")
		if pl.Selector.MatchLabels["os"] != goos || pl.Selector.MatchLabels["arch"] != goarch {
			t.Errorf("platform %d selects %v, want %s", i, pl.Selector.MatchLabels, want)
		}
		file := fmt.Sprintf("kubectl-erasure_%s_%s_%s.tar.gz", version, goos, goarch)
		if pl.URI != releaseURL+"/"+file {
			t.Errorf("platform %s: uri %s", want, pl.URI)
		}
		if got := sha256File(t, filepath.Join(dist, path.Base(pl.URI))); got != pl.SHA256 {
			t.Errorf("platform %s: the manifest says sha256 %s, the archive's is %s", want, pl.SHA256, got)
		}
		files := readArchive(t, filepath.Join(dist, file))
		if _, ok := files[pl.Bin]; !ok || pl.Bin != "kubectl-erasure" {
			t.Errorf("platform %s: bin %q is not in the archive", want, pl.Bin)
		}
		for _, f := range pl.Files {
			if _, ok := files[f.From]; !ok {
				t.Errorf("platform %s: files.from %q is not in the archive", want, f.From)
			}
		}
	}
}

// An SBOM is CycloneDX JSON describing this module's binary and the modules
// linked into it.
func checkSBOM(t *testing.T, file, dependency string) {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat   string `json:"bomFormat"`
		SpecVersion string `json:"specVersion"`
		Metadata    struct {
			Component struct {
				Name    string `json:"name"`
				Version string `json:"version"`
				PURL    string `json:"purl"`
			} `json:"component"`
		} `json:"metadata"`
		Components []struct {
			Name     string `json:"name"`
			Version  string `json:"version"`
			PURL     string `json:"purl"`
			Licenses []any  `json:"licenses"`
			Evidence struct {
				Licenses []any `json:"licenses"`
			} `json:"evidence"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &bom); err != nil {
		t.Fatalf("%s is not JSON: %v", file, err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.SpecVersion == "" {
		t.Errorf("%s: bomFormat %q specVersion %q", file, bom.BOMFormat, bom.SpecVersion)
	}
	if bom.Metadata.Component.Name != module || !strings.HasPrefix(bom.Metadata.Component.PURL, "pkg:golang/"+module) {
		t.Errorf("%s names %+v, want the module %s", file, bom.Metadata.Component, module)
	}
	found, licensed := false, 0
	for _, c := range bom.Components {
		if c.Name == dependency && c.Version != "" && strings.HasPrefix(c.PURL, "pkg:golang/"+dependency+"@") {
			found = true
		}
		if len(c.Licenses)+len(c.Evidence.Licenses) > 0 { // detected licences are evidence
			licensed++
		}
	}
	if !found || len(bom.Components) < 10 {
		t.Errorf("%s: %d components, %s among them: %v", file, len(bom.Components), dependency, found)
	}
	if licensed < len(bom.Components)/2 {
		t.Errorf("%s: only %d of %d components name a licence", file, licensed, len(bom.Components))
	}
}

// The packaged chart installs with helm into an API server, and its
// uninstall leaves the CRDs (and so the evidence) in place.
func checkChartInstalls(t *testing.T, chart string) {
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	dir := t.TempDir()
	kubeconfig, err := cp.WriteKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	helm := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(tool(t, "LETHE_HELM", "helm"), append(args, "--kubeconfig", kubeconfig)...)
		cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+dir+"/config", "HELM_CACHE_HOME="+dir+"/cache", "HELM_DATA_HOME="+dir+"/data")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := helm("install", "lethe", chart, "--namespace", "lethe-system", "--create-namespace")
	if !strings.Contains(out, "STATUS: deployed") || !strings.Contains(out, "kubectl erasure") {
		t.Fatalf("helm install:\n%s", out)
	}

	scheme := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "lethe-system", Name: "lethe"}, dep); err != nil {
		t.Fatalf("the release's Deployment: %v", err)
	}
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/lethe-dev/lethe:"+version {
		t.Errorf("the packaged chart runs %s, want the release's image tag %s", img, version)
	}
	if meta := helm("show", "chart", chart); !strings.Contains(meta, "image: ghcr.io/lethe-dev/lethe:"+version+"\n") ||
		!strings.Contains(meta, "appVersion: "+version) || !strings.Contains(meta, "version: "+chartVer) {
		t.Errorf("the packaged Chart.yaml does not name this release (version, appVersion, Artifact Hub image):\n%s", meta)
	}
	for _, o := range []struct {
		obj  client.Object
		name string
	}{
		{&corev1.ServiceAccount{}, "lethe"}, {&corev1.Service{}, "lethe-metrics"},
		{&rbacv1.ClusterRole{}, "lethe-manager"}, {&rbacv1.Role{}, "lethe-receipt-key"},
	} {
		if err := c.Get(ctx, types.NamespacedName{Namespace: "lethe-system", Name: o.name}, o.obj); err != nil {
			t.Errorf("%T %s: %v", o.obj, o.name, err)
		}
	}
	crds := []string{"erasurerequests.erasure.lethe.dev", "memorystores.erasure.lethe.dev"}
	for _, name := range crds {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, types.NamespacedName{Name: name}, crd); err != nil {
			t.Fatalf("CRD %s: %v", name, err)
		}
		if crd.Annotations["meta.helm.sh/release-name"] != "lethe" {
			t.Errorf("CRD %s is not managed by the release: %v", name, crd.Annotations)
		}
	}
	// An upgrade updates the release (CRDs included) in place.
	if out := helm("upgrade", "lethe", chart, "--namespace", "lethe-system", "--set", "replicas=2"); !strings.Contains(out, "REVISION: 2") {
		t.Errorf("helm upgrade:\n%s", out)
	}

	helm("uninstall", "lethe", "--namespace", "lethe-system")
	if err := c.Get(ctx, types.NamespacedName{Namespace: "lethe-system", Name: "lethe"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Deployment after uninstall: %v", err)
	}
	for _, name := range crds {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, types.NamespacedName{Name: name}, crd); err != nil || !crd.DeletionTimestamp.IsZero() {
			t.Errorf("CRD %s after uninstall: %v (deleting: %v); the keep policy must leave it", name, err, crd.DeletionTimestamp)
		}
	}
}

// The script derives the chart's and krew's semantic version from any
// version it is given, and refuses what is not one.
func TestReleaseVersions(t *testing.T) {
	root := repoRoot(t)
	for in, want := range map[string]string{
		"v1.2.3":                  "1.2.3",
		"1.2.3":                   "1.2.3",
		"v1.2.3-rc.1":             "1.2.3-rc.1",
		"v0.1.0-3-gabc1234-dirty": "0.1.0-3-gabc1234-dirty",
		"abc1234-dirty":           "-dev.abc1234-dirty", // an untagged commit: a pre-release of the chart's version
	} {
		cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "versions")
		cmd.Env = append(os.Environ(), "VERSION="+in)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("VERSION=%s: %v", in, err)
		}
		fields := strings.Fields(string(out))
		if len(fields) != 2 || fields[0] != in || !strings.HasSuffix(fields[1], want) || strings.HasPrefix(fields[1], "-") {
			t.Errorf("VERSION=%s gives %q, want the chart version to end in %s", in, out, want)
		}
	}
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "versions")
	cmd.Env = append(os.Environ(), "VERSION=feature/x")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "not a version") {
		t.Errorf("VERSION=feature/x: %v %s", err, out)
	}
}

// `make image` on a machine without a container engine says so and fails.
func TestImageWithoutAContainerEngineFailsClearly(t *testing.T) {
	root := repoRoot(t)
	// A PATH with the script's own tools only: no docker, podman or buildah.
	bin := t.TempDir()
	for _, name := range []string{"bash", "dirname", "git", "date", "sed"} {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "image")
	cmd.Env = append(os.Environ(), "PATH="+bin, "CONTAINER_ENGINE=")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 || !strings.Contains(string(out), "needs a container engine (docker, podman or buildah") {
		t.Fatalf("hack/release.sh image without an engine: %v\n%s", err, out)
	}
}
