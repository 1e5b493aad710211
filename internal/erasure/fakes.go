package erasure

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Fakes of the ports as structs of function fields, for unit tests of pure
// logic; the integration tests run the real services. A field left nil
// fails the call with ErrNotFaked, so a test cannot pass by a call it did
// not expect.

// ErrNotFaked is returned by a fake's method whose function is nil.
var ErrNotFaked = errors.New("fake: method not set")

// LedgerFns is a Ledger of function fields.
type LedgerFns struct {
	PlanFn             func(ctx context.Context, req Request) (Plan, error)
	TombstoneFn        func(ctx context.Context, req Request) (Plan, error)
	GraceFn            func(ctx context.Context, uid string) (GraceState, error)
	CancelFn           func(ctx context.Context, uid string) (Cancellation, error)
	DeleteFn           func(ctx context.Context, req Request, batchSize, probeBudget int) (DeleteResult, error)
	VerifyFn           func(ctx context.Context, req Request, keys ContentKeys) ([]Verification, error)
	ProbeResidueFn     func(ctx context.Context, probe []Embedding, maxDistance float64) ([]Residue, error)
	ProbeTextResidueFn func(ctx context.Context, sample []TextSample) (TextProbe, error)
	ReeraseFn          func(ctx context.Context, req Request) (BatchResult, error)
	RemoveResidueFn    func(ctx context.Context, req Request) (BatchResult, error)
	PositionFn         func(ctx context.Context) (string, error)
	VacuumFn           func(ctx context.Context, mode lethev1.VacuumMode) (VacuumResult, error)
	MirrorProofFn      func(ctx context.Context, p Proof) (int64, error)
	ProofMirroredFn    func(ctx context.Context, p Proof, index int64) (bool, error)
	ReceiptLogFn       func(ctx context.Context, origin string) ([][32]byte, error)
	WriteCheckpointFn  func(ctx context.Context, origin string, size int64, checkpoint string) error
	HeldByFn           func(ctx context.Context, uid string) (int64, error)
	ErasedSessionsFn   func(ctx context.Context, uid string) ([]string, error)
	DeletedAtFn        func(ctx context.Context, uid string) (time.Time, error)
	ReceiptsFn         func(ctx context.Context, uid, step string) (map[int]StepReceipt, error)
	WriteReceiptFn     func(ctx context.Context, uid, step string, batch, sessions int, counts []Count) error
	AppendReceiptFn    func(ctx context.Context, uid, step string, sessions int, counts []Count) error
}

var _ Ledger = &LedgerFns{}

func (f *LedgerFns) Plan(ctx context.Context, req Request) (Plan, error) {
	if f.PlanFn == nil {
		return Plan{}, ErrNotFaked
	}
	return f.PlanFn(ctx, req)
}

func (f *LedgerFns) Tombstone(ctx context.Context, req Request) (Plan, error) {
	if f.TombstoneFn == nil {
		return Plan{}, ErrNotFaked
	}
	return f.TombstoneFn(ctx, req)
}

func (f *LedgerFns) Grace(ctx context.Context, uid string) (GraceState, error) {
	if f.GraceFn == nil {
		return GraceState{}, ErrNotFaked
	}
	return f.GraceFn(ctx, uid)
}

func (f *LedgerFns) Cancel(ctx context.Context, uid string) (Cancellation, error) {
	if f.CancelFn == nil {
		return Cancellation{}, ErrNotFaked
	}
	return f.CancelFn(ctx, uid)
}

func (f *LedgerFns) Delete(ctx context.Context, req Request, batchSize, probeBudget int) (DeleteResult, error) {
	if f.DeleteFn == nil {
		return DeleteResult{}, ErrNotFaked
	}
	return f.DeleteFn(ctx, req, batchSize, probeBudget)
}

func (f *LedgerFns) Verify(ctx context.Context, req Request, keys ContentKeys) ([]Verification, error) {
	if f.VerifyFn == nil {
		return nil, ErrNotFaked
	}
	return f.VerifyFn(ctx, req, keys)
}

func (f *LedgerFns) ProbeResidue(ctx context.Context, probe []Embedding, maxDistance float64) ([]Residue, error) {
	if f.ProbeResidueFn == nil {
		return nil, ErrNotFaked
	}
	return f.ProbeResidueFn(ctx, probe, maxDistance)
}

func (f *LedgerFns) ProbeTextResidue(ctx context.Context, sample []TextSample) (TextProbe, error) {
	if f.ProbeTextResidueFn == nil {
		return TextProbe{}, ErrNotFaked
	}
	return f.ProbeTextResidueFn(ctx, sample)
}

func (f *LedgerFns) Reerase(ctx context.Context, req Request) (BatchResult, error) {
	if f.ReeraseFn == nil {
		return BatchResult{}, ErrNotFaked
	}
	return f.ReeraseFn(ctx, req)
}

func (f *LedgerFns) RemoveResidue(ctx context.Context, req Request) (BatchResult, error) {
	if f.RemoveResidueFn == nil {
		return BatchResult{}, ErrNotFaked
	}
	return f.RemoveResidueFn(ctx, req)
}

func (f *LedgerFns) Position(ctx context.Context) (string, error) {
	if f.PositionFn == nil {
		return "", ErrNotFaked
	}
	return f.PositionFn(ctx)
}

func (f *LedgerFns) Vacuum(ctx context.Context, mode lethev1.VacuumMode) (VacuumResult, error) {
	if f.VacuumFn == nil {
		return VacuumResult{}, ErrNotFaked
	}
	return f.VacuumFn(ctx, mode)
}

// StartVacuum runs Vacuum to its end: the ticket has ended when returned.
func (f *LedgerFns) StartVacuum(ctx context.Context, mode lethev1.VacuumMode) *VacuumTicket {
	return EndedVacuum(f.Vacuum(ctx, mode))
}

func (f *LedgerFns) HeldBy(ctx context.Context, uid string) (int64, error) {
	if f.HeldByFn == nil {
		return 0, ErrNotFaked
	}
	return f.HeldByFn(ctx, uid)
}

func (f *LedgerFns) MirrorProof(ctx context.Context, p Proof) (int64, error) {
	if f.MirrorProofFn == nil {
		return 0, nil
	}
	return f.MirrorProofFn(ctx, p)
}

func (f *LedgerFns) ProofMirrored(ctx context.Context, p Proof, index int64) (bool, error) {
	if f.ProofMirroredFn == nil {
		return false, nil
	}
	return f.ProofMirroredFn(ctx, p, index)
}

func (f *LedgerFns) ReceiptLog(ctx context.Context, origin string) ([][32]byte, error) {
	if f.ReceiptLogFn == nil {
		return nil, nil
	}
	return f.ReceiptLogFn(ctx, origin)
}

func (f *LedgerFns) WriteCheckpoint(ctx context.Context, origin string, size int64, checkpoint string) error {
	if f.WriteCheckpointFn == nil {
		return nil
	}
	return f.WriteCheckpointFn(ctx, origin, size, checkpoint)
}

func (f *LedgerFns) ErasedSessions(ctx context.Context, uid string) ([]string, error) {
	if f.ErasedSessionsFn == nil {
		return nil, ErrNotFaked
	}
	return f.ErasedSessionsFn(ctx, uid)
}

func (f *LedgerFns) DeletedAt(ctx context.Context, uid string) (time.Time, error) {
	if f.DeletedAtFn == nil {
		return time.Time{}, ErrNotFaked
	}
	return f.DeletedAtFn(ctx, uid)
}

func (f *LedgerFns) Receipts(ctx context.Context, uid, step string) (map[int]StepReceipt, error) {
	if f.ReceiptsFn == nil {
		return nil, ErrNotFaked
	}
	return f.ReceiptsFn(ctx, uid, step)
}

func (f *LedgerFns) WriteReceipt(ctx context.Context, uid, step string, batch, sessions int, counts []Count) error {
	if f.WriteReceiptFn == nil {
		return ErrNotFaked
	}
	return f.WriteReceiptFn(ctx, uid, step, batch, sessions, counts)
}

func (f *LedgerFns) AppendReceipt(ctx context.Context, uid, step string, sessions int, counts []Count) error {
	if f.AppendReceiptFn == nil {
		return ErrNotFaked
	}
	return f.AppendReceiptFn(ctx, uid, step, sessions, counts)
}

// GraphFns is a Graph of function fields.
type GraphFns struct {
	NameFn  func() string
	PruneFn func(ctx context.Context, sessionIDs []string, limit int) (GraphCounts, error)
	CountFn func(ctx context.Context, sessionIDs []string) (GraphCounts, error)
}

var _ Graph = &GraphFns{}

func (f *GraphFns) Name() string {
	if f.NameFn == nil {
		return "fake"
	}
	return f.NameFn()
}

func (f *GraphFns) Prune(ctx context.Context, sessionIDs []string, limit int) (GraphCounts, error) {
	if f.PruneFn == nil {
		return GraphCounts{}, ErrNotFaked
	}
	return f.PruneFn(ctx, sessionIDs, limit)
}

func (f *GraphFns) Count(ctx context.Context, sessionIDs []string) (GraphCounts, error) {
	if f.CountFn == nil {
		return GraphCounts{}, ErrNotFaked
	}
	return f.CountFn(ctx, sessionIDs)
}

// BackupsFns is a Backups of function fields.
type BackupsFns struct {
	InstalledFn func(ctx context.Context) (bool, error)
	RotateFn    func(ctx context.Context, sc BackupScope, req BackupRequest) ([]Backup, error)
	HoldingFn   func(ctx context.Context, sc BackupScope, req BackupRequest) (int, error)
}

var _ Backups = &BackupsFns{}

func (f *BackupsFns) Installed(ctx context.Context) (bool, error) {
	if f.InstalledFn == nil {
		return false, ErrNotFaked
	}
	return f.InstalledFn(ctx)
}

func (f *BackupsFns) Rotate(ctx context.Context, sc BackupScope, req BackupRequest) ([]Backup, error) {
	if f.RotateFn == nil {
		return nil, ErrNotFaked
	}
	return f.RotateFn(ctx, sc, req)
}

func (f *BackupsFns) Holding(ctx context.Context, sc BackupScope, req BackupRequest) (int, error) {
	if f.HoldingFn == nil {
		return 0, ErrNotFaked
	}
	return f.HoldingFn(ctx, sc, req)
}

// ReplicasFn is a Replicas of one function.
type ReplicasFn func(ctx context.Context, lsn string) (bool, error)

func (f ReplicasFn) CaughtUp(ctx context.Context, lsn string) (bool, error) { return f(ctx, lsn) }

// ClaimsFns is a Claims of function fields.
type ClaimsFns struct {
	CancelRequestedFn func(ctx context.Context) (bool, error)
	ClaimFn           func(ctx context.Context, claim metav1.Condition) (bool, error)
}

var _ Claims = &ClaimsFns{}

func (f *ClaimsFns) CancelRequested(ctx context.Context) (bool, error) {
	if f.CancelRequestedFn == nil {
		return false, ErrNotFaked
	}
	return f.CancelRequestedFn(ctx)
}

func (f *ClaimsFns) Claim(ctx context.Context, claim metav1.Condition) (bool, error) {
	if f.ClaimFn == nil {
		return false, ErrNotFaked
	}
	return f.ClaimFn(ctx, claim)
}
