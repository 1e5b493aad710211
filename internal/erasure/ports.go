package erasure

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// The ports: one small interface per external system the phase machine
// drives. Every call is safe to repeat unless its comment says otherwise:
// after a crash anywhere inside or after it, calling it again gives the
// same end state, and "already done" is success, never an error. A call
// returns an error only when it did not do its work; a *ConfigError when a
// human must fix the configuration (a missing Secret, a wrong server).

// Ledger is the memory database: the sessions, the erasure ledger and the
// receipts. Every read or change of a session is scoped to the store's
// tenant; the ledger's rows are scoped by request. Receipts are written in
// the same transaction as the work they record, once per (request, step,
// batch): the batch key is the deletion's or the graph step's batch index
// (deterministic over the sorted sessions), or, for repeated work
// (re-erasure, a graph prune repeated), chosen by the ledger.
type Ledger interface {
	// Plan counts what Tombstone would tombstone, changing nothing.
	Plan(ctx context.Context, req Request) (Plan, error)
	// Tombstone hides the request's sessions, writes their ledger rows and
	// the Tombstoned receipt in one transaction; a repeat reports the first
	// run's clock readings. ErrCancelled once the request's cancel ran: a
	// tombstone never commits after it.
	Tombstone(ctx context.Context, req Request) (Plan, error)
	// Grace reads the end of the request's grace period by the database's clock.
	Grace(ctx context.Context, uid string) (GraceState, error)
	// Cancel lifts the request's tombstones and writes the Cancelled
	// receipt; ErrTooLateToCancel once any session is erased. A repeat
	// reports the first run's figures.
	Cancel(ctx context.Context, uid string) (Cancellation, error)
	// Delete erases the eligible sessions (tombstoned by this request, not
	// cancelled, past the grace period by the database's clock) in batches
	// of batchSize, one transaction and one receipt each; batches done are
	// skipped. It samples at most probeBudget erased embeddings and, when
	// probeBudget > 0, at most min(probeBudget, TextProbeBudget) passages
	// of erased text, read before the rows are deleted.
	Delete(ctx context.Context, req Request, batchSize, probeBudget int) (DeleteResult, error)
	// Verify looks for anything left of the sessions req names (the ones
	// the request found), whether or not the ledger says they were erased.
	// keys, the content hashes the deletion read (nil: none), change how
	// it looks, never what it finds (ContentKeys).
	Verify(ctx context.Context, req Request, keys ContentKeys) ([]Verification, error)
	// ProbeResidue looks for near-identical copies of the probe embeddings
	// in every vector column outside the cascade, in every schema (a copy
	// may sit anywhere; only counts per column come back).
	ProbeResidue(ctx context.Context, probe []Embedding, maxDistance float64) ([]Residue, error)
	// ProbeTextResidue looks for verbatim copies of the sampled passages in
	// every text column outside the cascade that the manager's role can
	// read, in every schema, minus what the store excludes; only counts
	// per column come back, never text.
	ProbeTextResidue(ctx context.Context, sample []TextSample) (TextProbe, error)
	// Reerase erases again, at once, the sessions req names (the ones the
	// request found and erased) that exist again, and re-creates the ledger
	// rows a restore of the database took away, with a Resurrected receipt;
	// Skipped when nothing came back. When not Skipped, CommitLSN is a WAL
	// position read after the commit.
	Reerase(ctx context.Context, req Request) (BatchResult, error)
	// Position is the primary's WAL position now: a replica that replayed
	// past it holds every commit made before the call.
	Position(ctx context.Context) (string, error)
	// RemoveResidue removes what derives from the sessions of req the
	// request holds erased and outlived the deletion (derived records,
	// content-keyed entries), with a ResidueRemoved receipt; Skipped when
	// there was none.
	RemoveResidue(ctx context.Context, req Request) (BatchResult, error)
	// Vacuum vacuums, in mode (never Off), the tables a deletion touches
	// (the sessions table, its cascade, the content indexes, the lineage
	// and derived tables), so that erased tuples stop being readable from
	// the data files. Tables the role may not vacuum are counted, not an
	// error. At is the database's clock after the last one.
	Vacuum(ctx context.Context, mode lethev1.VacuumMode) (VacuumResult, error)
	// StartVacuum is Vacuum without the wait: it joins a vacuum that starts
	// after the call (so it covers every deletion committed before it) and
	// returns at once. The vacuum runs on when ctx ends.
	StartVacuum(ctx context.Context, mode lethev1.VacuumMode) *VacuumTicket
	// HeldBy counts the sessions the request holds in the ledger, neither
	// erased nor cancelled (its tombstones in force).
	HeldBy(ctx context.Context, uid string) (int64, error)
	// MirrorProof writes a completed request's receipt and history into
	// the database (through lethe.record_proof, which checks the chain);
	// a repeat changes nothing unless the history grew or the receipt
	// changed. It returns the index of the proof's leaf in the store's
	// receipt log (-1: a stale, shorter history that has none).
	MirrorProof(ctx context.Context, p Proof) (int64, error)
	// ProofMirrored reports whether the database holds p as MirrorProof
	// would leave it, so that writing it again would change nothing: the
	// same evidence format, history (its length and head) and document,
	// and the history's leaf in the receipt log, at index when index >= 0.
	// It writes nothing and checks no signature.
	ProofMirrored(ctx context.Context, p Proof, index int64) (bool, error)
	// ReceiptLog returns the leaf hashes of the receipt log named origin
	// (a store's: receiptlog.Origin), by index; stores sharing a database
	// each have their own.
	ReceiptLog(ctx context.Context, origin string) ([][32]byte, error)
	// WriteCheckpoint records the signed checkpoint of the log origin at
	// size (once per log and size: a repeat keeps the first).
	WriteCheckpoint(ctx context.Context, origin string, size int64, checkpoint string) error
	// ErasedSessions lists the sessions the request erased, sorted.
	ErasedSessions(ctx context.Context, uid string) ([]string, error)
	// DeletedAt is when the request's deletion last committed; zero when it
	// erased nothing.
	DeletedAt(ctx context.Context, uid string) (time.Time, error)
	// Receipts returns the receipts of one step of a request, by batch.
	Receipts(ctx context.Context, uid, step string) (map[int]StepReceipt, error)
	// WriteReceipt records batch of a step done outside the database; a
	// repeat keeps the first receipt.
	WriteReceipt(ctx context.Context, uid, step string, batch, sessions int, counts []Count) error
	// AppendReceipt records one more run of a step under the next free batch
	// key. It is not idempotent: each call records a run.
	AppendReceipt(ctx context.Context, uid, step string, sessions int, counts []Count) error
}

// Graph is the knowledge graph derived from the memory. Its calls are
// bounded by their context.
type Graph interface {
	// Name names the graph, for evidence.
	Name() string
	// Prune removes the elements whose provenance is only the given
	// sessions, at most limit per query, and returns what it removed.
	Prune(ctx context.Context, sessionIDs []string, limit int) (GraphCounts, error)
	// Count counts the elements with provenance in the given sessions.
	Count(ctx context.Context, sessionIDs []string) (GraphCounts, error)
}

// Backups is Velero.
type Backups interface {
	// Installed reports whether Velero's CRDs are served, asked anew each time.
	Installed(ctx context.Context) (bool, error)
	// Rotate makes every Backup of the scope that started before the
	// deletion expire by the request's deadline (or asks Velero to delete
	// it, for an immediate request), never lengthening an expiration, and
	// reports each one. A repeat changes nothing.
	Rotate(ctx context.Context, sc BackupScope, req BackupRequest) ([]Backup, error)
	// Holding counts the Backups of the scope that started before the
	// request's DeletedAt, changing nothing.
	Holding(ctx context.Context, sc BackupScope, req BackupRequest) (int, error)
}

// Replicas are the store's read replicas.
type Replicas interface {
	// CaughtUp reports whether every replica replayed past lsn (true when
	// there is none).
	CaughtUp(ctx context.Context, lsn string) (bool, error)
}

// Claims writes the claim on the request before its deletion starts: the
// intent to delete, written with optimistic concurrency on the version
// whose cancel (none, or one too late to apply) the pass acted on, so that
// a concurrent cancel makes the claim fail rather than lose.
type Claims interface {
	// CancelRequested reports whether the request asks to cancel, as of the
	// version the claim would be written on: the pass's own when that one
	// does not ask (a later cancel makes the claim's write conflict), else
	// the latest, read uncached (false when the pass's is older: it may
	// not show a claim written since).
	CancelRequested(ctx context.Context) (bool, error)
	// Claim records the given Deleted condition in the pass's status and
	// writes that whole status on top of the version CancelRequested chose
	// (GracePeriodElapsed, True, goes with it); false (nothing written)
	// when the request changed since.
	Claim(ctx context.Context, claim metav1.Condition) (bool, error)
}

// Ports are what one pass works through. Graph and Backups are nil when the
// store configures no graph or no Velero.
type Ports struct {
	Ledger   Ledger
	Graph    Graph
	Backups  Backups
	Replicas Replicas
	Claims   Claims
	Clock    clock.PassiveClock
}

// ConfigError is what stands in the way when a human must change the
// configuration (a missing Secret, an invalid URL): its reason and message
// are stable and safe to show in a condition.
type ConfigError struct {
	Reason  string
	Message string
}

func (e *ConfigError) Error() string { return e.Message }
