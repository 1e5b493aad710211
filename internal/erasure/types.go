package erasure

import (
	"errors"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// Request identifies an erasure request to the ledger.
type Request struct {
	UID string
	// SessionIDs requested (lowercase UUIDs).
	SessionIDs []string
	// Grace is the grace period; zero for immediate requests.
	Grace time.Duration
}

// Count is a number of rows for one table (or kind).
type Count struct {
	Table string
	Rows  int64
}

// Plan is what an erasure removes, taken in the tombstone transaction.
type Plan struct {
	Found               []string
	NotFound            []string
	Rows                []Count
	Embeddings          int64
	ContentIndexEntries int64
	DerivedRecords      int64
	// TombstonedAt and GraceEndsAt are the database's clock readings.
	TombstonedAt time.Time
	GraceEndsAt  time.Time
	// CommitLSN (Tombstone only) is a WAL position at or after the
	// tombstone's commit: a replica past it hides the sessions too.
	CommitLSN string
	// HiddenAt (Tombstone only) is the latest tombstone of the found
	// sessions, by whichever request or run set it.
	HiddenAt time.Time
}

// GraceState is the grace period by the database's clock.
type GraceState struct {
	Now         time.Time
	GraceEndsAt time.Time
	Elapsed     bool
	// LedgerRows counts the request's session rows in the ledger, in any
	// state; NotErased those of them not marked erased (cancelled ones
	// included). None at all after a tombstone means a restore of the
	// database took them away.
	LedgerRows, NotErased int64
	// TombstonedAt is when the ledger's first session row was written, and
	// EarliestEnd the earliest end of a grace period among them (zero
	// without one; GraceEndsAt is the latest).
	TombstonedAt, EarliestEnd time.Time
}

// Cancellation is what a cancel did, by the database's clock.
type Cancellation struct {
	Lifted int64
	At     time.Time
}

// BatchResult is what one deletion batch did.
type BatchResult struct {
	Batch    int
	Sessions int
	// Rows removed per table, the cascade included.
	Rows                []Count
	ContentIndexEntries int64
	DerivedRecords      int64
	DeletedAt           time.Time
	// Skipped is true when the batch had nothing eligible (already done,
	// cancelled, or not yet past its grace period).
	Skipped bool
	// LedgerRowsRestored (re-erasure only) counts the request's ledger rows
	// found missing or not marked erased: the database was restored.
	LedgerRowsRestored int64
	// CommitLSN (RemoveResidue and Reerase, when not Skipped) is a WAL
	// position at or after the commit: a replica past it no longer holds
	// what was removed.
	CommitLSN string
}

// Embedding is one erased embedding kept, in memory only, for the residue probe.
type Embedding []float32

// TextSample is a passage of an erased session's text (its first words),
// kept in memory only for the text residue probe. It prints as "[text]":
// a sample must never reach a log, an error, an event or the evidence.
type TextSample string

func (TextSample) String() string   { return "[text]" }
func (TextSample) GoString() string { return "[text]" }

// The text residue probe's bounds.
const (
	// TextProbeBudget bounds the passages of erased text sampled per
	// request (and never more than the probe budget): each one adds its
	// shingles' substring searches over every text value outside the
	// cascade (BenchmarkP1TextProbe measures the cost).
	TextProbeBudget = 16
	// TextPassageMinWords is the fewest words a text needs to be sampled:
	// two shingles, so that one common phrase is never a copy.
	TextPassageMinWords = 16
)

// DeleteResult is what the whole deletion did.
type DeleteResult struct {
	Batches []BatchResult
	// Probe holds a bounded sample of the erased embeddings, read inside the
	// transactions and kept in memory only, for the residue probe.
	Probe []Embedding
	// Texts holds a bounded sample of passages of the erased text, read
	// inside the transactions and kept in memory only, for the text probe.
	Texts []TextSample
	// TextRows counts the deleted rows the text sample was taken from
	// (those of the tables with a string column; a count that costs the
	// deletion nothing: counting the long texts cost a quarter of it).
	TextRows int64
	// CommitLSN is the WAL position after the last commit (for replicas).
	CommitLSN string
	// ErasedAt is the latest erased_at of the request's sessions (by
	// anyone), read no later than CommitLSN: an erasure committed after
	// that position is not in it. Zero when none is erased.
	ErasedAt time.Time
	// ContentKeys are the content hashes of the sessions this call erased,
	// for Verify.
	ContentKeys ContentKeys
}

// ContentKeys are the application's content hashes (never the content) of
// erased sessions, as the deletion read them inside its transactions, kept
// in memory only. Verify looks the content indexes up by them when, keyed,
// they cover every content row the request holds in the ledger; otherwise
// (nil, or sessions erased before a manager restart, or content that left
// the sessions after their tombstone) it hashes every entry of each content
// index. Either way it counts the same entries. Like the residue samples,
// they must never reach a log, an error, an event, a metric or the
// evidence: a list of them is a dictionary of erased content.
type ContentKeys []string

// MaxContentKeys bounds the ContentKeys a deletion keeps (about 4 MiB of
// SHA-256 hex): past it, it keeps none and Verify hashes the content
// indexes, a cost that a deletion of that size dwarfs.
const MaxContentKeys = 50_000

// Verification is one "nothing left" check.
type Verification struct {
	Check string
	Found int64
}

// Residue is a copy of erased content found after deletion: a
// near-identical embedding, or a verbatim copy of a sampled passage.
type Residue struct {
	// Column is schema.table.column.
	Column string
	// Found counts the probe's embeddings or passages with a copy there.
	Found int64
}

// TextProbe is what the text residue probe did and found: counts and
// column names only, never text.
type TextProbe struct {
	Residue []Residue
	// Columns counts the text columns outside the cascade probed.
	Columns int
	// Unreadable counts those the manager's role may not read (not
	// probed); Excluded those the store excludes from the probes.
	Unreadable, Excluded int
}

// StepReceipt is one receipt row of a step.
type StepReceipt struct {
	Batch    int
	Sessions int
	Counts   map[string]int64
	// At is when the receipt's transaction started, by the database's clock:
	// the time a re-erasure's Resurrected entry carries (zero from a ledger
	// that does not date its receipts).
	At time.Time
}

// Counts a Deleted receipt holds beside its tables'.
const (
	CountContentIndexEntries = "content-keyed index entries"
	CountDerivedRecords      = "derived records"
	// CountLedgerRowsPutBack (Resurrected receipts) counts the ledger rows
	// a re-erasure found missing or not erased and put back in force.
	CountLedgerRowsPutBack = "erasure ledger rows put back"
)

// Counts of the Deleted step's evidence on the vacuum after the deletion.
const (
	CountTablesVacuumed    = "tables vacuumed"
	CountTablesNotVacuumed = "tables not vacuumed: the role neither owns them nor holds MAINTAIN"
)

// Receipt steps, the step column of lethe.erasure_receipts.
const (
	StepTombstoned  = "Tombstoned"
	StepDeleted     = "Deleted"
	StepCancelled   = "Cancelled"
	StepResurrected = "Resurrected"
	// StepResidueRemoved receipts residue removed after the deletion.
	StepResidueRemoved = "ResidueRemoved"
	StepGraph          = "GraphReconciled"
)

// ErrTooLateToCancel means some sessions of the request are already erased.
var ErrTooLateToCancel = errors.New("the deletion has already started; the request can no longer be cancelled")

// ErrCancelled means the request holds a Cancelled receipt: its sessions
// are not tombstoned again (a pass that read the request before its cancel).
var ErrCancelled = errors.New("the request was cancelled; its sessions are not tombstoned")

// GraphAttachedKey counts relationships not of the erased provenance (another's,
// or none) deleted with the erased nodes they were attached to.
const GraphAttachedKey = "(other provenance, attached to erased nodes)"

// GraphCounts is what a prune removed, or a count found, per node label and
// relationship type. It holds numbers only, never content.
type GraphCounts struct {
	Nodes         map[string]int64
	Relationships map[string]int64
}

// Total is the sum of every count.
func (c GraphCounts) Total() int64 { return c.NodeTotal() + c.RelationshipTotal() }

// NodeTotal is the sum of the node counts.
func (c GraphCounts) NodeTotal() int64 { return sumValues(c.Nodes) }

// RelationshipTotal is the sum of the relationship counts.
func (c GraphCounts) RelationshipTotal() int64 { return sumValues(c.Relationships) }

func sumValues(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// Add adds o into c.
func (c *GraphCounts) Add(o GraphCounts) {
	if c.Nodes == nil {
		c.Nodes = map[string]int64{}
	}
	if c.Relationships == nil {
		c.Relationships = map[string]int64{}
	}
	for k, v := range o.Nodes {
		c.Nodes[k] += v
	}
	for k, v := range o.Relationships {
		c.Relationships[k] += v
	}
}

// Keys returns "graph nodes :Label" / "graph relationships :TYPE" entries
// in a stable order, for evidence.
func (c GraphCounts) Keys() []KeyCount {
	var out []KeyCount
	for k, v := range c.Nodes {
		out = append(out, KeyCount{"graph nodes :" + k, v})
	}
	for k, v := range c.Relationships {
		if k == GraphAttachedKey {
			out = append(out, KeyCount{"graph relationships " + k, v})
			continue
		}
		out = append(out, KeyCount{"graph relationships :" + k, v})
	}
	slices.SortFunc(out, func(a, b KeyCount) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// KeyCount is one entry of GraphCounts.Keys.
type KeyCount struct {
	Key   string
	Count int64
}

// BackupRequest is what the backup step needs to know of an erasure request.
type BackupRequest struct {
	UID, Namespace, Name string
	// Immediate requests delete the Backups (DeleteBackupRequest) instead of
	// shortening their expiration.
	Immediate bool
	// DeletedAt is when the deletion committed, by the database's clock
	// (read just before the commit). Backups started before it may hold the
	// erased sessions.
	DeletedAt time.Time
	// Window is the store's rotationWindow: such a Backup expires at the
	// latest at DeletedAt + Window.
	Window time.Duration
	// Recorded names the Backups the request's evidence lists already:
	// the request is counted in their annotation summary once, not on
	// every pass.
	Recorded map[string]bool
	// Pending names the Backups the request's evidence lists and has not
	// seen gone. Each is looked for in the whole namespace when the
	// scope's selector no longer lists it (its labels, or the store's
	// selector, changed): it holds the data until Velero deletes it.
	Pending []string
}

// Deadline is the latest expiration a Backup holding the data may keep.
func (r BackupRequest) Deadline() time.Time { return r.DeletedAt.Add(r.Window) }

// BackupScope is where a store's Backups are and which of them are its own.
type BackupScope struct {
	Namespace string
	Selector  labels.Selector
	// DeleteOnImmediate: an immediate request may ask Velero to delete the
	// Backups (the store's spec.velero.deleteOnImmediate); otherwise it
	// shortens their expiration like any request.
	DeleteOnImmediate bool
	// MinRetention is the store's floor: a Backup is never made to expire
	// before its start plus MinRetention.
	MinRetention time.Duration
	// ClockSkew is the margin between Velero's clock and the database's: a
	// Backup that started up to ClockSkew after the deletion committed may
	// hold the erased data.
	ClockSkew time.Duration
}

// MayHold says whether a Backup that started at start may hold what the
// request deleted: it started before the deletion committed, give or take
// the clocks' skew.
func (sc BackupScope) MayHold(start time.Time, r BackupRequest) bool {
	return start.Before(r.DeletedAt.Add(sc.ClockSkew))
}

// DeletesBackups says whether the request asks Velero to delete the
// Backups of the scope rather than shortening their expiration.
func (sc BackupScope) DeletesBackups(r BackupRequest) bool {
	return r.Immediate && sc.DeleteOnImmediate
}

// Backup is one Backup that may hold the erased data, as Lethe left it.
type Backup struct {
	Name               string
	UID                string
	StartedAt          time.Time
	OriginalExpiration *time.Time
	Expiration         *time.Time
	// DeleteRequest names the DeleteBackupRequest for it (immediate requests).
	DeleteRequest string
	// DeleteFailed is Velero's error when it processed that request and
	// could not delete the Backup (empty otherwise).
	DeleteFailed string
	// Changed is true when this call shortened it or requested its deletion.
	Changed bool
}

// RestoreFinding is what a check of the erasures a store holds found for one
// request: the database holds less erasure than the request says.
type RestoreFinding struct {
	UID string
	// SessionsBack are sessions the request found and erased that exist again.
	SessionsBack int64
	// LedgerRowsMissing are found sessions without an erased ledger row.
	LedgerRowsMissing int64
}

// TombstoneHold is one request's hold on tombstoned sessions, as the
// ledger has it: the sessions not yet erased, and whether its deletion
// started (some session erased already).
type TombstoneHold struct {
	UID        string
	SessionIDs []string
	Started    bool
}

// Recorded is what the store's record (kept in the API server) says one
// request erased: how many sessions, and the keyed hashes of their sources
// with the erasure key they are under (SourcesKey, empty: unknown).
type Recorded struct {
	UID        string
	Sessions   int
	Sources    []string
	SourcesKey string
}

// The verification checks of residue a deletion can leave and
// RemoveResidue removes begin with these (the table follows).
const (
	CheckPrefixContent = "content-keyed entries in "
	CheckPrefixDerived = "derived records via "
)

// VacuumResult is what Ledger.Vacuum did.
type VacuumResult struct {
	// Vacuumed and NotPermitted count the tables vacuumed and those the
	// role may not vacuum (it neither owns them nor holds MAINTAIN).
	Vacuumed, NotPermitted int
	// At is the database's clock after the last vacuum.
	At time.Time
}

// VacuumTicket is the vacuum Ledger.StartVacuum joined: Done is closed
// when it has ended, and Result says how from then on.
type VacuumTicket struct {
	done   <-chan struct{}
	result func() (VacuumResult, error)
}

// NewVacuumTicket is the ticket of a vacuum that closes done when it has
// ended; result is called only after that.
func NewVacuumTicket(done <-chan struct{}, result func() (VacuumResult, error)) *VacuumTicket {
	return &VacuumTicket{done: done, result: result}
}

// EndedVacuum is the ticket of a vacuum that has ended with res and err.
func EndedVacuum(res VacuumResult, err error) *VacuumTicket {
	done := make(chan struct{})
	close(done)
	return NewVacuumTicket(done, func() (VacuumResult, error) { return res, err })
}

// Done is closed when the vacuum has ended.
func (t *VacuumTicket) Done() <-chan struct{} { return t.done }

// Ended reports whether the vacuum has ended.
func (t *VacuumTicket) Ended() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// Result is what the vacuum did; it waits for the vacuum to end.
func (t *VacuumTicket) Result() (VacuumResult, error) {
	<-t.done
	return t.result()
}

// Proof is a completed request's receipt and history, as mirrored into the
// memory database (Ledger.MirrorProof) so that it outlives the request.
type Proof struct {
	UID             string
	Digest          string
	Envelope, KeyID string
	IssuedAt        time.Time
	History         []lethev1.HistoryEntry
	// Format is the request's evidence format; Document its evidence
	// document (evidence.DocumentOf), so the proof verifies without the object.
	Format   string
	Document any
	// Log is the origin of the store's receipt log the proof's leaves go
	// into (receiptlog.Origin of the store's UID).
	Log string
}
