package controllers

import (
	"context"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// indexWaitingOnBackups indexes the requests that are or will be on the
// backup step (tombstoned, BackupsRotated not yet) by the name of their
// store: from Tombstoned on, so that a Velero event arriving before the cache
// has the request's latest phase still finds it.
const indexWaitingOnBackups = "erasure.lethe.dev/waiting-on-backups"

// DefaultVeleroDiscoveryInterval is how often the manager asks whether
// Velero's CRDs are served, until they are.
const DefaultVeleroDiscoveryInterval = 10 * time.Second

// veleroWatch starts the ErasureRequest controller's watches of Velero's
// Backups and DeleteBackupRequests once discovery first sees their CRDs
// (the manager may start before Velero is installed; no restart needed).
// From then on a request waiting on the backup step gets a pass as soon as
// a Backup goes or a DeleteBackupRequest is processed, rather than at its
// next recheck. It runs on the leader only, like the controller.
type veleroWatch struct {
	detector VeleroDetector
	ctrl     controller.Controller
	cache    cache.Cache
	reader   client.Reader
	interval time.Duration
}

func (w *veleroWatch) NeedLeaderElection() bool { return true }

// Start asks discovery every interval until Velero is installed, then adds
// the watches and returns (the controller keeps them).
func (w *veleroWatch) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("velero-watch")
	for {
		installed, err := w.detector.Installed(ctx)
		if err != nil {
			log.Error(err, "cannot ask the API server for Velero's APIs; asking again")
		}
		if installed {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.interval):
		}
	}
	enqueue := handler.EnqueueRequestsFromMapFunc(w.requestsWaitingIn)
	if err := w.ctrl.Watch(source.Kind[client.Object](w.cache, &velerov1.Backup{}, enqueue, goneOrChanged())); err != nil {
		return err
	}
	if err := w.ctrl.Watch(source.Kind[client.Object](w.cache, &velerov1.DeleteBackupRequest{}, enqueue, goneOrChanged())); err != nil {
		return err
	}
	log.Info("watching Velero's Backups and DeleteBackupRequests")
	return nil
}

// goneOrChanged passes deletions and status changes (a Backup's phase or
// expiration, a DeleteBackupRequest processed); creations need no pass: a
// Backup created after a deletion cannot hold the erased data, and one
// re-synced from its bucket is the re-verification's.
func goneOrChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			switch o := e.ObjectOld.(type) {
			case *velerov1.Backup:
				n, ok := e.ObjectNew.(*velerov1.Backup)
				return ok && (o.Status.Phase != n.Status.Phase || !o.Status.Expiration.Equal(n.Status.Expiration))
			case *velerov1.DeleteBackupRequest:
				n, ok := e.ObjectNew.(*velerov1.DeleteBackupRequest)
				return ok && o.Status.Phase != n.Status.Phase
			}
			return false
		},
	}
}

// requestsWaitingIn maps a Velero object to the requests on the backup step
// whose store's Backups live in its namespace.
func (w *veleroWatch) requestsWaitingIn(ctx context.Context, obj client.Object) []reconcile.Request {
	stores := &lethev1.MemoryStoreList{}
	if err := w.reader.List(ctx, stores, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list MemoryStores for a Velero event")
		return nil
	}
	var out []reconcile.Request
	for _, s := range stores.Items {
		if s.Spec.Velero == nil || s.Spec.Velero.NamespaceOrDefault() != obj.GetNamespace() {
			continue
		}
		ers := &lethev1.ErasureRequestList{}
		if err := w.reader.List(ctx, ers, client.InNamespace(s.Namespace), client.MatchingFields{indexWaitingOnBackups: s.Name}, client.UnsafeDisableDeepCopy); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "list the requests waiting on the backup step")
			return nil
		}
		for _, er := range ers.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: er.Namespace, Name: er.Name}})
		}
	}
	return out
}

// waitingOnBackups is the index function: the store of a request that is
// tombstoned and whose backup step is not done.
func waitingOnBackups(obj client.Object) []string {
	er, ok := obj.(*lethev1.ErasureRequest)
	if !ok {
		return nil
	}
	switch er.Status.Phase {
	case lethev1.PhaseTombstoned, lethev1.PhaseGracePeriod, lethev1.PhaseDeleted, lethev1.PhaseGraphReconciled:
		return []string{er.Spec.StoreRef.Name}
	}
	return nil
}
