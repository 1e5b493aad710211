package erasure

import (
	"context"
	"testing"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// A replica whose Secret is missing waits with the ConfigError's reason and
// message (a human must add it), not as a lagging replica.
func TestReplicaConfigErrorSaysWhatToFix(t *testing.T) {
	configCond := &Condition{Type: lethev1.ConditionDeleted, Reason: errConfig.Reason, Message: errConfig.Message}
	runCases(t, runDeletion, map[string]stepCase{
		"ReplicaConfigError": {reason: "A replica blocked by the configuration waits with the ConfigError's reason and message.",
			er: atDeletion(), fakes: deletionFakes(func(f *fakes) {
				f.replicas = func(context.Context, string) (bool, error) { return false, errConfig }
			}),
			want: stepWant{out: Outcome{Kind: Waiting, Condition: configCond, Evidence: ptr(deletedEvidence(cleanChecks...)), Work: deleted("grace").Work, RequeueAfter: testConfig.RetryAfter},
				status: after(atDeletion(), withCond(configCond), withEvidence(deletedEvidence(cleanChecks...))),
				calls:  []string{cancelRequestedCall, claimCall, deleteCall, deletedReceiptsCall, deletedAtCall, verifyCall, textProbeCall, probeCall, replicaCall}}},
	})
}

// The backup re-verification returns the port's own error, for the log.
func TestBackupReverifyKeepsThePortsError(t *testing.T) {
	runCases(t, reverifyBackups, map[string]stepCase{
		"InstalledError": {reason: "Discovery failing: the error is the port's.",
			er: completed(), store: newStore(withVelero), fakes: backupFakes(nil, func(f *fakes) {
				f.backups.InstalledFn = func(context.Context) (bool, error) { return false, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(completed()), calls: []string{installedCall}}},
		"LedgerError": {reason: "The deletion time not read: the error is the database's.",
			er: completed(), store: newStore(withVelero), fakes: backupFakes(nil, func(f *fakes) {
				f.ledger.DeletedAtFn = func(context.Context, string) (time.Time, error) { return time.Time{}, errPort }
			}),
			want: stepWant{out: Outcome{Kind: Errored}, err: errPort, status: after(completed()), calls: []string{installedCall, deletedAtCall}}},
	})
}

// A ledger answering no receipts with a nil map does not crash the graph step.
func TestGraphStepTakesNilReceipts(t *testing.T) {
	f := graphFakes(func(f *fakes) {
		f.ledger.ReceiptsFn = func(context.Context, string, string) (map[int]StepReceipt, error) { return nil, nil }
		f.graph.PruneFn = pruneAnswers(result{c: batch0}, result{}, result{c: batch2})
	})
	ports, _ := f.wire(t)
	out := GraphPrune{Config: testConfig}.Run(context.Background(), &Scope{Request: atGraph(), Store: newStore(withGraph), Ports: ports})
	if out.Kind != Done {
		t.Errorf("kind %d, want Done", out.Kind)
	}
}

// The wait for an expiring Backup never exceeds BackupRecheck.
func TestBackupWaitIsBoundedByTheRecheck(t *testing.T) {
	soon := now.Add(time.Hour - 300*time.Millisecond).Truncate(time.Second) // 59m59.3s from now
	b := Backup{Name: "b", StartedAt: committed.Add(-time.Hour), OriginalExpiration: &soon, Expiration: &soon}
	ports, _ := backupFakes([]Backup{b}).wire(t)
	out := BackupRotation{Config: testConfig}.Run(context.Background(), &Scope{Request: atBackups(), Store: newStore(withVelero), Ports: ports})
	if out.RequeueAfter > testConfig.BackupRecheck {
		t.Errorf("RequeueAfter %s, want at most BackupRecheck %s", out.RequeueAfter, testConfig.BackupRecheck)
	}
}
