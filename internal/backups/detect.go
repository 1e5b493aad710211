// Package backups is Lethe's adapter to Velero: which Backups may hold erased
// data, and making them expire.
package backups

import (
	"context"
	"fmt"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
)

// Resources Lethe needs from Velero's API.
var requiredResources = []string{"backups", "deletebackuprequests"}

// Detector reports whether Velero's CRDs are served. It asks discovery on
// every call (no cached answer), so CRDs installed after the manager started
// are seen without a restart.
type Detector struct {
	Discovery discovery.DiscoveryInterface
}

// Installed returns true when velero.io/v1 serves Backups and DeleteBackupRequests.
func (d Detector) Installed(_ context.Context) (bool, error) {
	list, err := d.Discovery.ServerResourcesForGroupVersion(velerov1.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", velerov1.SchemeGroupVersion, err)
	}
	served := map[string]bool{}
	for _, r := range list.APIResources {
		served[r.Name] = true
	}
	for _, r := range requiredResources {
		if !served[r] {
			return false, nil
		}
	}
	return true, nil
}
