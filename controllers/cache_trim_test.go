package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// completedForCache is a request as the watch decodes it at completion.
func completedForCache(deleted metav1.ConditionStatus) *lethev1.ErasureRequest {
	now := metav1.Now()
	return &lethev1.ErasureRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns", UID: "u-1", ResourceVersion: "7",
			Finalizers:    []string{Finalizer},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "lethe", Operation: metav1.ManagedFieldsOperationUpdate}}},
		Spec: lethev1.ErasureRequestSpec{StoreRef: lethev1.StoreReference{Name: "store"}, SessionIDs: []lethev1.SessionID{"a", "b"}},
		Status: lethev1.ErasureRequestStatus{
			Phase: lethev1.PhaseBackupsRotated,
			Conditions: []metav1.Condition{
				{Type: lethev1.ConditionTombstoned, Status: metav1.ConditionTrue, Reason: "Tombstoned", LastTransitionTime: now},
				{Type: lethev1.ConditionDeleted, Status: deleted, Reason: "Deleted", LastTransitionTime: now},
			},
			Plan:           &lethev1.ErasurePlan{SessionsFound: 1, NotFoundSessionIDs: []lethev1.SessionID{"b"}},
			Evidence:       &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{{}}},
			EvidenceFormat: "lethe.dev/evidence/v1",
			History:        []lethev1.HistoryEntry{{Phase: lethev1.PhaseTombstoned, Digest: "sha256:1"}, {Phase: lethev1.PhaseDeleted, Digest: "sha256:2"}},
			Receipt: &lethev1.Receipt{Digest: "sha256:2", Envelope: `{"payload":"..."}`, KeyID: "k1", IssuedAt: &now,
				Log: &lethev1.LogInclusion{Index: 3, HistoryLength: 2, Checkpoint: "log\n4\nroot\n", InclusionProof: []string{"aGFzaA=="}}},
		},
	}
}

func TestTrimErasureRequestsPastDeletion(t *testing.T) {
	in := completedForCache(metav1.ConditionTrue)
	orig := in.DeepCopy()
	out, err := trimErasureRequests(nil)(in)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*lethev1.ErasureRequest)
	if got.Status.History != nil || got.Status.Evidence != nil {
		t.Errorf("history and evidence are kept in the cache: %d entries, evidence %v", len(got.Status.History), got.Status.Evidence)
	}
	rc := got.Status.Receipt
	if rc.Envelope != "" || rc.Log.InclusionProof != nil {
		t.Errorf("the receipt's envelope or inclusion proof is kept: %+v", rc)
	}
	// What the cache's other readers use is kept exactly.
	if rc.Digest != orig.Status.Receipt.Digest || rc.KeyID != "k1" || !rc.IssuedAt.Equal(orig.Status.Receipt.IssuedAt) ||
		rc.Log.Checkpoint != orig.Status.Receipt.Log.Checkpoint || rc.Log.Index != 3 || rc.Log.HistoryLength != 2 {
		t.Errorf("receipt digest, key, time or log checkpoint changed: %+v %+v", rc, rc.Log)
	}
	if !equality.Semantic.DeepEqual(got.Spec, orig.Spec) || !equality.Semantic.DeepEqual(got.Status.Conditions, orig.Status.Conditions) ||
		!equality.Semantic.DeepEqual(got.Status.Plan, orig.Status.Plan) || got.Status.Phase != orig.Status.Phase ||
		!equality.Semantic.DeepEqual(got.ObjectMeta, orig.ObjectMeta) {
		t.Error("spec, conditions, plan, phase or metadata changed by the trim")
	}
	if !trimmedInCache(got) || !trimmedInCache(orig) {
		t.Error("trimmedInCache must say the same of the object before and after the trim")
	}
}

func TestTrimErasureRequestsLeavesWorkInProgress(t *testing.T) {
	for _, st := range []metav1.ConditionStatus{metav1.ConditionFalse, metav1.ConditionUnknown} {
		in := completedForCache(st)
		orig := in.DeepCopy()
		out, err := trimErasureRequests(nil)(in)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(out, orig) {
			t.Errorf("Deleted=%s: a request before its deletion is changed in the cache", st)
		}
		if trimmedInCache(orig) {
			t.Errorf("Deleted=%s: reported as trimmed", st)
		}
	}
}

func TestCacheOptionsStripManagedFieldsThenTrim(t *testing.T) {
	opts := CacheOptions(true)
	var tf toolscache.TransformFunc
	for obj, by := range opts.ByObject {
		if _, ok := obj.(*lethev1.ErasureRequest); ok {
			tf = by.Transform
		}
	}
	if tf == nil || opts.DefaultTransform == nil {
		t.Fatal("the ErasureRequest transform or the default transform is missing")
	}
	out, err := tf(completedForCache(metav1.ConditionTrue))
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*lethev1.ErasureRequest)
	if got.ManagedFields != nil || got.Status.History != nil {
		t.Errorf("managedFields %v or history %d left in the cache", got.ManagedFields, len(got.Status.History))
	}
	// Objects that are not requests (a tombstone of a deleted one) pass through.
	tomb := toolscache.DeletedFinalStateUnknown{Key: "ns/r"}
	if o, err := tf(tomb); err != nil || o != tomb {
		t.Errorf("a DeletedFinalStateUnknown is changed: %v %v", o, err)
	}
	if keep := CacheOptions(false); keep.DefaultTransform != nil {
		t.Error("--cache-strip-managed-fields=false still strips")
	}
}

// A request past its deletion whose Backups outlive its deadline, as the
// manager's cache holds it (trimmed): the metrics still project the
// Backups late and export when they expire, until they are rotated.
func TestTrimmedRequestStillProjectsItsBackupsLate(t *testing.T) {
	in := completedForCache(metav1.ConditionTrue)
	in.Status.Phase = lethev1.PhaseGraphReconciled
	deadline := metav1.NewTime(time.Now().Add(24 * time.Hour))
	late := metav1.NewTime(deadline.Add(48 * time.Hour))
	early := metav1.NewTime(deadline.Add(-time.Hour))
	in.Status.Deadline = &deadline
	in.Status.Evidence = &lethev1.ErasureEvidence{Steps: []lethev1.StepEvidence{
		{Step: lethev1.ConditionDeleted, Note: "deleted"},
		{Step: lethev1.ConditionBackupsRotated, Note: "shortened", Backups: []lethev1.BackupEvidence{
			{Name: "nightly-1", StartedAt: &early, OriginalExpiration: &late, Expiration: &late},
			{Name: "nightly-2", Expiration: &early},
		}},
	}}
	out, err := trimErasureRequests(nil)(in.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*lethev1.ErasureRequest)
	d := tallyRequests([]lethev1.ErasureRequest{*got}).byNS["ns"]
	if d == nil || d.lateBackups != 1 || !d.backupsExpireBy.Equal(late.Time) {
		t.Fatalf("the trimmed request's Backups: %+v, want 1 projected late, expiring by %v", d, late.Time)
	}
	if st := got.Status.Evidence.Steps; len(st) != 1 || st[0].Note != "" || len(st[0].Backups) != 1 ||
		st[0].Backups[0].Name != "nightly-1" || st[0].Backups[0].OriginalExpiration != nil || st[0].Backups[0].StartedAt != nil {
		t.Errorf("the cache keeps more than the name and expiration of the Backup that expires last: %+v", got.Status.Evidence)
	}

	in.Status.Phase = lethev1.PhaseBackupsRotated
	in.Status.Conditions = append(in.Status.Conditions, metav1.Condition{Type: lethev1.ConditionBackupsRotated, Status: metav1.ConditionTrue, Reason: "BackupsGone"})
	out, err = trimErasureRequests(nil)(in)
	if err != nil {
		t.Fatal(err)
	}
	if ev := out.(*lethev1.ErasureRequest).Status.Evidence; ev != nil {
		t.Errorf("a request whose Backups are rotated keeps evidence in the cache: %+v", ev)
	}
}
