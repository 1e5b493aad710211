package history

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/backups"
)

// statusObs is one observed version of an ErasureRequest.
type statusObs struct {
	UID     string
	RV      int64
	Phase   lethev1.Phase
	Cancel  bool
	Claimed bool // the Deleted step has been claimed (or is done)
	History []string
	Deleted bool // the object was deleted
	// Conditions are the status conditions as type=status/reason, for reports.
	Conditions []string
}

// backupObs is one observed version of a Velero Backup.
type backupObs struct {
	Name        string
	UID         string
	RV          int64
	Expiration  *time.Time
	Annotations map[string]string
	Deleted     bool
}

// dbrObs is one observed DeleteBackupRequest.
type dbrObs struct {
	Name, BackupName, BackupUID string
	Added                       bool
	// ByLethe: it carries Lethe's request label (Velero's own garbage
	// collection creates DeleteBackupRequests too, at expiration).
	ByLethe bool
}

// apiRecorder watches the objects Lethe writes in the API server. The
// watches start from the resource version of a list, so no change after
// start is missed; a watch that ends is resumed from its last version.
//
// It also keeps the last observed version of each request and store: the
// round's waits read those, not the API server. Polling it (every
// namespace's requests listed five times a second, each store read three
// times a second) made the harness the API server's largest client.
type apiRecorder struct {
	mu       sync.Mutex
	requests []statusObs
	backups  []backupObs
	dbrs     []dbrObs
	// lastRequest is each request's last observed version.
	lastRequest map[types.NamespacedName]statusObs
	// intact is each store's last observed ErasuresIntact condition (nil:
	// none yet); restoreSeen, the stores ever observed with it False for
	// RestoreDetected.
	intact      map[types.NamespacedName]*metav1.Condition
	restoreSeen map[types.NamespacedName]bool
	// velero times Velero's deletion of Backups (veleroDeletions).
	velero veleroDeletions
	// failed is the first watch that ended in an error (an expired
	// resource version): the record and the states after it are
	// incomplete, and the round fails with it (err).
	failed error
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func rvOf(o client.Object) int64 {
	v, _ := strconv.ParseInt(o.GetResourceVersion(), 10, 64)
	return v
}

func startAPIRecorder(ctx context.Context, c client.WithWatch) (*apiRecorder, error) {
	ctx, cancel := context.WithCancel(ctx)
	r := &apiRecorder{cancel: cancel, lastRequest: map[types.NamespacedName]statusObs{}, velero: veleroDeletions{started: map[string]time.Time{}},
		intact: map[types.NamespacedName]*metav1.Condition{}, restoreSeen: map[types.NamespacedName]bool{}}
	lists := []struct {
		list  client.ObjectList
		opts  []client.ListOption
		apply func(watch.EventType, client.Object)
	}{
		{&lethev1.ErasureRequestList{}, nil, r.request},
		{&velerov1.BackupList{}, []client.ListOption{client.InNamespace(veleroNS)}, r.backup},
		{&velerov1.DeleteBackupRequestList{}, []client.ListOption{client.InNamespace(veleroNS)}, r.dbr},
		{&lethev1.MemoryStoreList{}, nil, r.store},
	}
	for _, l := range lists {
		if err := c.List(ctx, l.list, l.opts...); err != nil {
			cancel()
			return nil, err
		}
		// The round's stores exist before it starts: their state is the
		// list's, then the watch's.
		if stores, ok := l.list.(*lethev1.MemoryStoreList); ok {
			for i := range stores.Items {
				r.store(watch.Added, &stores.Items[i])
			}
		}
		rv := l.list.(interface{ GetResourceVersion() string }).GetResourceVersion()
		r.wg.Add(1)
		go r.follow(ctx, c, l.list, l.opts, rv, l.apply)
	}
	return r, nil
}

func (r *apiRecorder) follow(ctx context.Context, c client.WithWatch, list client.ObjectList, opts []client.ListOption, rv string, apply func(watch.EventType, client.Object)) {
	defer r.wg.Done()
	for ctx.Err() == nil {
		w, err := c.Watch(ctx, list, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})...)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				w.Stop()
				if ctx.Err() != nil {
					// stop: client-go ends a watch it cancels with an error.
					return
				}
				// Resuming from rv would fail the same way, and a list would
				// skip what changed in between: the record has a gap.
				r.fail(fmt.Errorf("the API recorder's watch of %T failed from resource version %s: %w", list, rv, apierrors.FromObject(ev.Object)))
				return
			}
			o, ok := ev.Object.(client.Object)
			if !ok {
				continue
			}
			rv = o.GetResourceVersion()
			if ev.Type == watch.Bookmark {
				continue
			}
			apply(ev.Type, o)
		}
		w.Stop()
	}
}

func (r *apiRecorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed == nil {
		r.failed = err
	}
}

// err is the first watch failure (nil: every watch has followed the API
// server so far).
func (r *apiRecorder) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// stop ends the watches once they have seen everything up to now: the
// caller lists first, so a final state is never missing from the record.
func (r *apiRecorder) stop() {
	r.cancel()
	r.wg.Wait()
}

func (r *apiRecorder) request(t watch.EventType, o client.Object) {
	er, ok := o.(*lethev1.ErasureRequest)
	if !ok {
		return
	}
	obs := statusObs{UID: string(er.UID), RV: rvOf(er), Phase: er.Status.Phase, Cancel: er.Spec.Cancel, Deleted: t == watch.Deleted}
	if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionDeleted); c != nil &&
		(c.Reason == lethev1.ReasonDeleting || c.Status == "True") {
		obs.Claimed = true
	}
	for _, h := range er.Status.History {
		obs.History = append(obs.History, h.Digest)
	}
	for _, c := range er.Status.Conditions {
		obs.Conditions = append(obs.Conditions, c.Type+"="+string(c.Status)+"/"+c.Reason)
	}
	r.mu.Lock()
	r.requests = append(r.requests, obs)
	r.lastRequest[client.ObjectKeyFromObject(er)] = obs
	r.mu.Unlock()
}

func (r *apiRecorder) store(t watch.EventType, o client.Object) {
	s, ok := o.(*lethev1.MemoryStore)
	if !ok {
		return
	}
	key := client.ObjectKeyFromObject(s)
	c := meta.FindStatusCondition(s.Status.Conditions, lethev1.MemoryStoreErasuresIntact)
	r.mu.Lock()
	defer r.mu.Unlock()
	if t == watch.Deleted {
		delete(r.intact, key)
		return
	}
	r.intact[key] = c
	if c != nil && c.Reason == lethev1.ReasonRestoreDetected {
		r.restoreSeen[key] = true
	}
}

// pending names the plans' requests not yet done (BackupsRotated or
// Cancelled) by their last observed version, and those not yet observed;
// "" when all are done. A request deleted is not pending.
func (r *apiRecorder) pending(plans []*runPlan) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, p := range plans {
		for _, pr := range p.Requests {
			key := keyOf(p.NS, pr.Name)
			obs, seen := r.lastRequest[key]
			switch {
			case !seen:
				out = append(out, fmt.Sprintf("%s not yet observed", key))
			case obs.Deleted:
			case !requestDone(obs.Phase):
				out = append(out, fmt.Sprintf("%s at %q", key, obs.Phase))
			}
		}
	}
	return strings.Join(out, ", ")
}

// storeIntact is the store's last observed ErasuresIntact condition (nil:
// none, or the store is gone), and whether any version observed since the
// round started (or since forgetRestoresSeen) had it False for
// RestoreDetected.
func (r *apiRecorder) storeIntact(p *runPlan) (c *metav1.Condition, restoreSeen bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := keyOf(p.NS, "memory")
	return r.intact[key], r.restoreSeen[key]
}

// forgetRestoresSeen starts storeIntact's RestoreDetected anew: a restore
// is about to be made, and only what the stores say after it counts.
func (r *apiRecorder) forgetRestoresSeen() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.restoreSeen)
}

func (r *apiRecorder) backup(t watch.EventType, o client.Object) {
	b, ok := o.(*velerov1.Backup)
	if !ok {
		return
	}
	obs := backupObs{Name: b.Name, UID: string(b.UID), RV: rvOf(b), Annotations: b.Annotations, Deleted: t == watch.Deleted}
	if b.Status.Expiration != nil {
		exp := b.Status.Expiration.Time
		obs.Expiration = &exp
	}
	r.mu.Lock()
	r.backups = append(r.backups, obs)
	r.mu.Unlock()
}

func (r *apiRecorder) dbr(t watch.EventType, o client.Object) {
	d, ok := o.(*velerov1.DeleteBackupRequest)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.velero.observe(d, time.Now())
	if t != watch.Added {
		return
	}
	r.dbrs = append(r.dbrs, dbrObs{Name: d.Name, BackupName: d.Spec.BackupName, BackupUID: d.Labels[velerov1.BackupUIDLabel], Added: true,
		ByLethe: d.Labels[backups.LabelRequestUID] != ""})
}

// veleroDeletions adds up the time Velero spends deleting Backups: from a
// DeleteBackupRequest's InProgress to its Processed, as the watch sees
// them. Velero has one worker for them, so the sum is time no other
// deletion could use: every run's Backup is deleted, and R13's budget is
// 0.72 s a run.
type veleroDeletions struct {
	started map[string]time.Time
	done    int
	busy    time.Duration
}

func (v *veleroDeletions) observe(d *velerov1.DeleteBackupRequest, at time.Time) {
	switch d.Status.Phase {
	case velerov1.DeleteBackupRequestPhaseInProgress:
		if _, ok := v.started[d.Name]; !ok {
			v.started[d.Name] = at
		}
	case velerov1.DeleteBackupRequestPhaseProcessed:
		if t0, ok := v.started[d.Name]; ok {
			delete(v.started, d.Name)
			v.done++
			v.busy += at.Sub(t0)
		}
	}
}

// deletions is what Velero deleted while the recorder watched: how many
// Backups, and the time its deletion worker took.
func (r *apiRecorder) deletions() (int, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.velero.done, r.velero.busy
}
