package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/metrics"
	"github.com/lethe-dev/lethe/internal/postgres"
)

// residueDistance is the cosine distance below which a vector counts as a
// copy of an erased embedding.
const residueDistance = 1e-6

// tombstone: one transaction tombstones the tenant's sessions, writes the
// ledger and the receipt, and takes the plan. A dry run only plans.
func (r *ErasureRequestReconciler) tombstone(ctx context.Context, s *scope) (bool, error) {
	er := s.req
	if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionTombstoned) {
		return true, nil
	}
	req := request(er)
	if er.Spec.DryRun {
		plan, err := s.eraser.PlanOnly(ctx, req)
		if err != nil {
			r.setStep(s, lethev1.ConditionTombstoned, false, lethev1.ReasonDatabaseUnavailable, "the plan could not be taken: "+err.Error())
			return false, err
		}
		er.Status.Plan = planStatus(plan)
		r.setStep(s, lethev1.ConditionTombstoned, false, lethev1.ReasonDryRun, "dry run: the plan is in status.plan and nothing was tombstoned")
		r.milestone(s, lethev1.PhasePlanned, lethev1.ReasonDryRun, plan.TombstonedAt, er.Status.Plan,
			fmt.Sprintf("dry run planned: %d of %d sessions found", len(plan.Found), len(req.SessionIDs)))
		return false, nil
	}
	if er.Spec.Cancel {
		// Cancelled before anything happened: nothing to lift.
		r.setStep(s, lethev1.ConditionGracePeriodElapsed, false, lethev1.ReasonCancelled, "cancelled before the sessions were tombstoned")
		r.milestone(s, lethev1.PhaseCancelled, "", r.Clock.Now(), map[string]int{"tombstonesLifted": 0}, "cancelled before tombstoning")
		return false, nil
	}
	plan, err := s.eraser.Tombstone(ctx, req, func(p postgres.Plan) (string, error) { return evidence.Digest(planStatus(p)) })
	if err != nil {
		r.setStep(s, lethev1.ConditionTombstoned, false, lethev1.ReasonDatabaseUnavailable, "the tombstone transaction failed: "+err.Error())
		return false, err
	}
	if r.crashAt(s, "after-tombstone-commit") {
		return false, nil
	}
	er.Status.Plan = planStatus(plan)
	er.Status.GraceEndsAt = mtime(plan.GraceEndsAt)
	ev := lethev1.StepEvidence{Step: lethev1.ConditionTombstoned, StartedAt: mtime(plan.TombstonedAt), CompletedAt: mtime(plan.TombstonedAt),
		Counts: er.Status.Plan.Rows, Note: fmt.Sprintf("%d of %d sessions found and tombstoned", len(plan.Found), len(req.SessionIDs))}
	setEvidence(&er.Status, ev)
	reason, msg := lethev1.ReasonSessionsTombstoned, "the requested sessions of this tenant are tombstoned and hidden from every read path"
	if len(plan.Found) == 0 {
		reason, msg = lethev1.ReasonNoSessionsFound, "none of the requested sessions exists for this store's tenant; nothing was touched"
	}
	r.setStep(s, lethev1.ConditionTombstoned, true, reason, msg)
	r.milestone(s, lethev1.PhaseTombstoned, "", plan.TombstonedAt, er.Status.Plan, ev.Note)
	return true, nil
}

// grace waits out the grace period by the database's clock; cancel lifts
// the tombstone; immediate skips the wait.
func (r *ErasureRequestReconciler) grace(ctx context.Context, s *scope) (bool, error) {
	er := s.req
	if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionGracePeriodElapsed) {
		return true, nil
	}
	if er.Spec.Cancel {
		cancelled, err := r.cancel(ctx, s)
		if err != nil || cancelled {
			return false, err
		}
		// Too late: the deletion had started before the cancel arrived.
	}
	if er.Spec.Immediate {
		r.setStep(s, lethev1.ConditionGracePeriodElapsed, true, lethev1.ReasonImmediate, "spec.immediate skips the grace period; spec.reason says why")
		r.milestone(s, lethev1.PhaseGracePeriod, lethev1.ReasonImmediate, r.Clock.Now(), map[string]string{"reason": er.Spec.Reason},
			"grace period skipped (immediate)")
		return true, nil
	}
	g, err := s.eraser.Grace(ctx, string(er.UID))
	if err != nil {
		r.setStep(s, lethev1.ConditionGracePeriodElapsed, false, lethev1.ReasonDatabaseUnavailable, "the database clock could not be read: "+err.Error())
		return false, err
	}
	er.Status.GraceEndsAt = mtime(g.GraceEndsAt)
	if !g.Elapsed {
		r.setStep(s, lethev1.ConditionGracePeriodElapsed, false, lethev1.ReasonWaitingForGrace,
			"waiting until status.graceEndsAt by the database's clock; set spec.cancel to undo")
		// Requeue at the right time by the database clock; never sleep.
		s.result = ctrl.Result{RequeueAfter: g.GraceEndsAt.Sub(g.Now) + time.Second}
		return false, nil
	}
	r.setStep(s, lethev1.ConditionGracePeriodElapsed, true, lethev1.ReasonGraceElapsed, "the grace period has elapsed by the database's clock")
	r.milestone(s, lethev1.PhaseGracePeriod, "", g.Now, map[string]string{"graceEndsAt": g.GraceEndsAt.UTC().Format(time.RFC3339)},
		"grace period elapsed")
	return true, nil
}

// cancel lifts the tombstones and ends the request as Cancelled. It returns
// false when the deletion has started: the cancel is then too late and ignored.
func (r *ErasureRequestReconciler) cancel(ctx context.Context, s *scope) (bool, error) {
	er := s.req
	d, _ := evidence.Digest(map[string]string{"cancelled": string(er.UID)})
	lifted, at, err := s.eraser.Cancel(ctx, string(er.UID), d)
	if errors.Is(err, postgres.ErrTooLateToCancel) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	setEvidence(&er.Status, lethev1.StepEvidence{Step: lethev1.ReasonCancelled, CompletedAt: mtime(at),
		Note: fmt.Sprintf("%d tombstone(s) lifted; the ledger marks the request cancelled", lifted)})
	r.setStep(s, lethev1.ConditionGracePeriodElapsed, false, lethev1.ReasonCancelled, "spec.cancel: the tombstones were lifted before deletion")
	r.milestone(s, lethev1.PhaseCancelled, "", at, map[string]int64{"tombstonesLifted": lifted}, "cancelled: tombstones lifted")
	return true, nil
}

// delete claims the deletion, deletes in bounded batches, verifies, probes
// for residue and waits for the replicas.
func (r *ErasureRequestReconciler) delete(ctx context.Context, s *scope) (bool, error) {
	er := s.req
	if meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionDeleted) {
		return true, nil
	}
	if !meta.IsStatusConditionTrue(s.store.Status.Conditions, lethev1.MemoryStoreSchemaCompliant) {
		r.setStep(s, lethev1.ConditionDeleted, false, lethev1.ReasonStoreNotReady,
			"the MemoryStore's SchemaCompliant is not True: a deletion could leave rows behind")
		s.result = ctrl.Result{RequeueAfter: r.RetryAfter}
		return false, nil
	}
	if c := meta.FindStatusCondition(er.Status.Conditions, lethev1.ConditionDeleted); c == nil || c.Reason != lethev1.ReasonDeleting {
		claimed, err := r.claim(ctx, s)
		if err != nil || !claimed {
			return false, err
		}
	}
	if r.crashAt(s, "after-claim") {
		return false, nil
	}
	req := request(er)
	digest := func(b postgres.BatchResult) (string, error) {
		if r.crashAt(s, "inside-delete-transaction") {
			return "", errors.New("simulated crash inside the deletion transaction")
		}
		return evidence.Digest(b)
	}
	res, err := s.eraser.Delete(ctx, req, r.BatchSize, r.ProbeBudget, digest)
	if s.crashed {
		return false, nil
	}
	if err != nil {
		r.setStep(s, lethev1.ConditionDeleted, false, lethev1.ReasonDeleting, "deletion claimed; a batch failed and will be retried")
		return false, err
	}
	if probe, ok := r.takeProbe(er.UID); ok && len(res.Probe) == 0 {
		res.Probe = probe // the batches ran in an earlier pass of this process
	} else if len(res.Probe) > 0 {
		r.probes.Store(er.UID, res.Probe)
	}

	if r.crashAt(s, "after-delete-commit") {
		return false, nil
	}
	counts, sessions, cache, derived, last := sumBatches(res.Batches)
	if last.IsZero() {
		last = r.Clock.Now()
	}
	checks, err := s.eraser.Verify(ctx, string(er.UID))
	if err != nil {
		return false, err
	}
	ev := lethev1.StepEvidence{Step: lethev1.ConditionDeleted, CompletedAt: mtime(last), Counts: counts}
	ev.Counts = append(ev.Counts, lethev1.TableCount{Table: "content-keyed index entries", Rows: cache},
		lethev1.TableCount{Table: "derived records", Rows: derived})
	var left []string
	for _, c := range checks {
		ev.Verification = append(ev.Verification, lethev1.Verification{Check: c.Check, Found: c.Found})
		if c.Found > 0 {
			left = append(left, c.Check)
		}
	}
	residue, err := s.eraser.ProbeResidue(ctx, res.Probe, residueDistance)
	if err != nil {
		// E.g. a vector column the manager's role may not read: say so
		// (grant it SELECT) rather than leave "deleting" standing.
		r.setStep(s, lethev1.ConditionDeleted, false, lethev1.ReasonDeleting, "deleted; the residue probe failed and is retried: "+err.Error())
		return false, err
	}
	var residueCols []string
	for _, rs := range residue {
		residueCols = append(residueCols, rs.Column.String())
		ev.Verification = append(ev.Verification, lethev1.Verification{Check: "near-identical vectors in " + rs.Column.String(), Found: rs.Found})
	}
	ev.Note = fmt.Sprintf("%d session(s) deleted in %d batch(es) of at most %d; residue probe: %d of %d erased embeddings (planned) probed against every vector column outside the cascade",
		sessions, len(res.Batches), r.BatchSize, len(res.Probe), plannedEmbeddings(er))
	setEvidence(&er.Status, ev)
	switch {
	case len(left) > 0:
		r.setStep(s, lethev1.ConditionDeleted, false, lethev1.ReasonVerificationFailed, "rows of the erased sessions remain: "+strings.Join(left, "; "))
		s.result = ctrl.Result{RequeueAfter: r.ReverifyInterval}
		return false, nil
	case len(residueCols) > 0:
		r.setStep(s, lethev1.ConditionDeleted, false, lethev1.ReasonResidueFound,
			"near-identical copies of erased embeddings remain in "+strings.Join(residueCols, ", ")+": remove them; Lethe probes again")
		r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, lethev1.ReasonResidueFound, "Verify", "residue found in %d column(s)", len(residueCols))
		s.result = ctrl.Result{RequeueAfter: r.RetryAfter}
		return false, nil
	}
	if caughtUp, err := r.replicasCaughtUp(ctx, s, res.CommitLSN); err != nil || !caughtUp {
		r.setStep(s, lethev1.ConditionDeleted, false, lethev1.ReasonReplicaLagging, "waiting for every replica to replay past the deletion")
		s.result = ctrl.Result{RequeueAfter: 2 * time.Second}
		return false, err
	}
	if r.crashAt(s, "before-status-write") {
		return false, nil
	}
	r.probes.Delete(er.UID)
	r.setStep(s, lethev1.ConditionDeleted, true, lethev1.ReasonSessionsDeleted,
		"the sessions, every row cascading from them, their content-keyed entries and derived records are deleted and verified absent")
	r.milestone(s, lethev1.PhaseDeleted, "", last, ev, ev.Note)
	mode := "grace"
	if er.Spec.Immediate {
		mode = "immediate"
	}
	metrics.TombstoneReaper.WithLabelValues(mode).Add(float64(sessions))
	for _, c := range counts {
		metrics.RowsDeleted.WithLabelValues(c.Table).Add(float64(c.Rows))
	}
	return true, nil
}

// claim writes the intent to delete with optimistic concurrency, after an
// uncached read that shows the request not cancelled. A concurrent cancel
// makes the claim fail; the next pass then cancels instead.
func (r *ErasureRequestReconciler) claim(ctx context.Context, s *scope) (bool, error) {
	fresh := &lethev1.ErasureRequest{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.req), fresh); err != nil {
		return false, err
	}
	if fresh.Spec.Cancel {
		cancelled, err := r.cancel(ctx, s)
		if err != nil || cancelled {
			return false, err
		}
	}
	r.setStep(s, lethev1.ConditionDeleted, false, lethev1.ReasonDeleting, "deletion claimed; deleting in bounded batches")
	base := fresh.DeepCopy()
	fresh.Status = *s.req.Status.DeepCopy()
	if err := r.Client.Status().Patch(ctx, fresh, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			s.result = ctrl.Result{RequeueAfter: time.Second}
			return false, nil
		}
		return false, err
	}
	// The claim is written: later changes of this pass patch on top of it.
	s.before = fresh.DeepCopy()
	s.req.ResourceVersion = fresh.ResourceVersion
	return true, nil
}

// replicasCaughtUp checks every configured replica replayed past lsn.
func (r *ErasureRequestReconciler) replicasCaughtUp(ctx context.Context, s *scope, lsn string) (bool, error) {
	for i, rep := range s.store.Spec.Postgres.Replicas {
		dsn, f := readSecretKey(ctx, r.SecretReader, s.store.Namespace, rep.DSNSecretRef)
		if f != nil {
			return false, errors.New(f.message)
		}
		pool, err := r.Pools.Get(ctx, poolKey(s.store, fmt.Sprintf("replica %d", i)), dsn)
		if err != nil {
			return false, err
		}
		ok, err := postgres.ReplicaCaughtUp(ctx, pool, lsn)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// notConfigured completes a step the store has no section for.
func (r *ErasureRequestReconciler) notConfigured(s *scope, cond string, msg string) (bool, error) {
	r.setStep(s, cond, true, lethev1.ReasonNotConfigured, msg)
	r.milestone(s, milestoneOf[cond], lethev1.ReasonNotConfigured, r.Clock.Now(), map[string]string{"step": cond, "reason": lethev1.ReasonNotConfigured}, cond+": not configured")
	return true, nil
}

// reverify erases again, at once, any erased session that reappeared (a
// restored backup) and records the resurrection in the history.
func (r *ErasureRequestReconciler) reverify(ctx context.Context, s *scope) error {
	er := s.req
	res, err := s.eraser.Reerase(ctx, string(er.UID), len(er.Status.History), func(b postgres.BatchResult) (string, error) { return evidence.Digest(b) })
	if err != nil {
		return err
	}
	if res.Skipped {
		if err := r.reverifyGraph(ctx, s); err != nil {
			return err
		}
		return r.reverifyBackups(ctx, s)
	}
	ev := lethev1.StepEvidence{Step: lethev1.ReasonResurrected, CompletedAt: mtime(res.DeletedAt), Counts: toCounts(res.Rows),
		Note: fmt.Sprintf("%d resurrected session(s) erased again", res.Sessions)}
	setEvidence(&er.Status, ev)
	r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, lethev1.ReasonResurrected, "Erase", "%d erased session(s) reappeared and were erased again", res.Sessions)
	r.milestone(s, er.Status.Phase, lethev1.ReasonResurrected, res.DeletedAt, ev, ev.Note)
	return nil
}

func toCounts(cs []postgres.Count) []lethev1.TableCount {
	out := make([]lethev1.TableCount, len(cs))
	for i, c := range cs {
		out[i] = lethev1.TableCount{Table: c.Table, Rows: c.Rows}
	}
	return out
}

// finalize handles the deletion of the request object. During the grace
// period it lifts the tombstones (the database keeps a Cancelled receipt);
// once deletion started it finishes it; afterwards it undoes nothing.
func (r *ErasureRequestReconciler) finalize(ctx context.Context, s *scope) (ctrl.Result, error) {
	er := s.req
	if !controllerutil.ContainsFinalizer(er, Finalizer) {
		return ctrl.Result{}, nil
	}
	tombstoned := meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionTombstoned)
	deleted := meta.IsStatusConditionTrue(er.Status.Conditions, lethev1.ConditionDeleted)
	if tombstoned && !deleted {
		if ok := r.resolveStore(ctx, s); !ok {
			if s.store == nil {
				r.Recorder.Eventf(er, nil, corev1.EventTypeWarning, lethev1.ReasonStoreNotFound, "Finalize",
					"MemoryStore gone: the tombstones of this request stay in the database")
			} else {
				return ctrl.Result{RequeueAfter: r.RetryAfter}, nil
			}
		} else {
			d, _ := evidence.Digest(map[string]string{"withdrawn": string(er.UID)})
			lifted, _, err := s.eraser.Cancel(ctx, string(er.UID), d)
			switch {
			case errors.Is(err, postgres.ErrTooLateToCancel):
				// Deletion had started: finish it rather than leave it half-done.
				if _, err := s.eraser.Delete(ctx, request(er), r.BatchSize, 0, func(b postgres.BatchResult) (string, error) { return evidence.Digest(b) }); err != nil {
					return ctrl.Result{}, err
				}
				r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "DeletionFinished", "Finalize", "request deleted mid-deletion: the deletion was finished")
			case err != nil:
				return ctrl.Result{}, err
			default:
				r.Recorder.Eventf(er, nil, corev1.EventTypeNormal, "Withdrawn", "Finalize", "request deleted during the grace period: %d tombstone(s) lifted", lifted)
			}
		}
	}
	r.probes.Delete(er.UID)
	controllerutil.RemoveFinalizer(er, Finalizer)
	if err := patchFinalizers(ctx, r.Client, er); err != nil && !apierrors.IsNotFound(err) {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// plannedEmbeddings is the number of embeddings the plan found.
func plannedEmbeddings(er *lethev1.ErasureRequest) int64 {
	if er.Status.Plan == nil {
		return 0
	}
	return er.Status.Plan.Embeddings
}
