package erasurecli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/lethe-dev/lethe/internal/version"
)

// The labels the Helm chart and the kustomize manifests put on the manager's Deployment.
const (
	nameLabel    = "app.kubernetes.io/name"
	versionLabel = "app.kubernetes.io/version"
)

// versionInfo is what version prints; its JSON names follow kubectl version's.
type versionInfo struct {
	Client version.Info    `json:"clientVersion"`
	Server *serverVersions `json:"serverVersion,omitempty"`
}

type serverVersions struct {
	// Kubernetes is the API server's version (discovery).
	Kubernetes string `json:"kubernetes"`
	// Lethe is the manager's version from its Deployment's label.
	Lethe string `json:"lethe"`
}

func newVersion(o *options) *cobra.Command {
	var output string
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's build and, where readable, the cluster's and the Lethe manager's versions",
		Long: `Prints the plugin's version, commit and build date, the Kubernetes version of the
API server, and the Lethe manager's version (the ` + versionLabel + ` label of the
Deployment labelled ` + nameLabel + `=lethe). What cannot be read says "unknown";
version itself never fails for it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains([]string{"", "json", "yaml"}, output) {
				return fmt.Errorf("-o %s: version prints json or yaml", output)
			}
			info := versionInfo{Client: version.Get()}
			if !clientOnly {
				info.Server = o.serverVersions(cmd.Context())
			}
			var b []byte
			var err error
			switch output {
			case "json":
				b, err = json.MarshalIndent(info, "", "  ")
				b = append(b, '\n')
			case "yaml":
				b, err = yaml.Marshal(info)
			default:
				b = []byte(humanVersion(info))
			}
			if err != nil {
				return err
			}
			_, err = o.streams.Out.Write(b)
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml (default: text)")
	cmd.Flags().BoolVar(&clientOnly, "client", false, "only the plugin's own version; do not contact the cluster")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func humanVersion(info versionInfo) string {
	c := info.Client
	var b strings.Builder
	modified := ""
	if c.Modified {
		modified = " (modified work tree)"
	}
	fmt.Fprintf(&b, "Client: kubectl-erasure %s, commit %s%s, built %s, %s %s\n", c.Version, c.GitCommit, modified, c.BuildDate, c.GoVersion, c.Platform)
	if s := info.Server; s != nil {
		fmt.Fprintf(&b, "Server: Kubernetes %s\n", s.Kubernetes)
		fmt.Fprintf(&b, "Lethe manager: %s\n", s.Lethe)
	}
	return b.String()
}

// serverVersions asks discovery for the Kubernetes version and the
// manager's Deployments for Lethe's. Each is "unknown" when unreadable.
func (o *options) serverVersions(ctx context.Context) *serverVersions {
	sv := &serverVersions{Kubernetes: version.Unknown, Lethe: version.Unknown}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if cfg, err := o.flags.ToRESTConfig(); err == nil {
		// Discovery takes no context: a timeout keeps an unreachable
		// server from holding version up.
		cfg.Timeout = 10 * time.Second
		if dc, err := discovery.NewDiscoveryClientForConfig(cfg); err == nil {
			if v, err := dc.ServerVersion(); err == nil {
				sv.Kubernetes = v.GitVersion
			}
		}
	}
	cl, _, err := o.client()
	if err != nil {
		return sv
	}
	list := &appsv1.DeploymentList{}
	if err := cl.List(ctx, list, client.MatchingLabels{nameLabel: "lethe"}); err != nil {
		return sv
	}
	var found []string
	for _, d := range list.Items {
		if v := d.Labels[versionLabel]; v != "" && !slices.Contains(found, v) {
			found = append(found, v)
		}
	}
	if len(found) > 0 {
		slices.Sort(found)
		sv.Lethe = strings.Join(found, ", ")
	}
	return sv
}
