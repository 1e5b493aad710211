package history

import (
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Velero's deletion time is counted from a request's InProgress to its
// Processed, once each; a request seen only Processed (started before the
// watch) or only InProgress (not yet done) adds nothing.
func TestVeleroDeletionsCountFromInProgressToProcessed(t *testing.T) {
	dbr := func(name string, phase velerov1.DeleteBackupRequestPhase) *velerov1.DeleteBackupRequest {
		return &velerov1.DeleteBackupRequest{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: velerov1.DeleteBackupRequestStatus{Phase: phase}}
	}
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	v := veleroDeletions{started: map[string]time.Time{}}
	v.observe(dbr("a", velerov1.DeleteBackupRequestPhaseNew), at(0))
	v.observe(dbr("a", velerov1.DeleteBackupRequestPhaseInProgress), at(100))
	v.observe(dbr("a", velerov1.DeleteBackupRequestPhaseInProgress), at(300)) // a second update while in progress
	v.observe(dbr("a", velerov1.DeleteBackupRequestPhaseProcessed), at(800))
	v.observe(dbr("a", velerov1.DeleteBackupRequestPhaseProcessed), at(900)) // seen again (a resumed watch)
	v.observe(dbr("b", velerov1.DeleteBackupRequestPhaseProcessed), at(1000))
	v.observe(dbr("c", velerov1.DeleteBackupRequestPhaseInProgress), at(1000))
	if v.done != 1 || v.busy != 700*time.Millisecond {
		t.Fatalf("%d deletions in %s, want 1 in 700ms", v.done, v.busy)
	}
}
