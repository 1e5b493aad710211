package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SessionID is a memory session's UUID in canonical lowercase form. Postgres
// compares UUIDs case-insensitively, so only one spelling is admitted; that
// keeps the set's uniqueness check meaningful.
// +kubebuilder:validation:MinLength=36
// +kubebuilder:validation:MaxLength=36
// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$')",message="each session ID must be a UUID in lowercase canonical form, such as 0b5c1f5e-3d2a-4c8e-9f10-2a6b7c8d9e0f"
type SessionID string

// StoreReference names a MemoryStore in the request's own namespace.
// +kubebuilder:validation:XValidation:rule="!has(self.__namespace__)",message="storeRef may not name a namespace: a request can only use a MemoryStore in its own namespace"
type StoreReference struct {
	// name of the MemoryStore.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// namespace is not allowed. It exists only so that a cross-namespace
	// reference is refused with a clear message instead of silently pruned.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// ErasureRequestSpec is one request to erase a set of sessions. It is
// immutable once created, except cancel, which may only go from false to true.
//
// +kubebuilder:validation:XValidation:rule="!self.immediate || (has(self.reason) && self.reason.trim().size() > 0)",message="spec.reason is required when spec.immediate is true: say why the grace period is skipped"
// +kubebuilder:validation:XValidation:rule="self.immediate || !has(self.gracePeriod) || duration(self.gracePeriod) > duration('0s')",message="gracePeriod 0s skips the grace period, the undo for typos: set spec.immediate: true with spec.reason instead"
// +kubebuilder:validation:XValidation:rule="has(self.requestedAt) == has(oldSelf.requestedAt) && (!has(self.requestedAt) || self.requestedAt == oldSelf.requestedAt) && has(self.reason) == has(oldSelf.reason) && (!has(self.reason) || self.reason == oldSelf.reason)",message="spec is immutable after creation; only spec.cancel may change, from false to true"
// +kubebuilder:validation:XValidation:rule="!oldSelf.cancel || self.cancel",message="spec.cancel can only change from false to true"
type ErasureRequestSpec struct {
	// storeRef names the MemoryStore, in the same namespace, to erase from.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable after creation; only spec.cancel may change, from false to true"
	StoreRef StoreReference `json:"storeRef"`

	// sessionIDs are the sessions to erase: 1 to 1000 unique UUIDs.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1000
	// +listType=set
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable after creation; only spec.cancel may change, from false to true"
	SessionIDs []SessionID `json:"sessionIDs"`

	// requestedAt is when the data subject asked; it defaults to the
	// request's creation. status.deadline is one calendar month later.
	// +optional
	RequestedAt *metav1.Time `json:"requestedAt,omitempty"`

	// gracePeriod is how long the sessions stay tombstoned (and the request
	// can be cancelled) before they are deleted, by the database's clock.
	// +kubebuilder:default="168h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('0s')",message="gracePeriod must be a non-negative Go duration such as 168h or 30m"
	// +optional
	// Compared as durations: clients re-serialise "168h" as "168h0m0s".
	// +kubebuilder:validation:XValidation:rule="duration(self) == duration(oldSelf)",message="spec is immutable after creation; only spec.cancel may change, from false to true"
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`

	// immediate skips the grace period (for deadline-bound requests); it needs a reason.
	// +kubebuilder:default=false
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable after creation; only spec.cancel may change, from false to true"
	Immediate bool `json:"immediate"`

	// reason is free text kept in the evidence. Never put personal data here.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Reason string `json:"reason,omitempty"`

	// dryRun computes the plan and changes nothing at all.
	// +kubebuilder:default=false
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable after creation; only spec.cancel may change, from false to true"
	DryRun bool `json:"dryRun"`

	// cancel lifts the tombstone; honoured only before deletion starts.
	// +kubebuilder:default=false
	// +optional
	Cancel bool `json:"cancel"`
}

// Phase is the last milestone an ErasureRequest reached. It is derived from
// the conditions, never the other way round.
// +kubebuilder:validation:Enum=Pending;Planned;Tombstoned;GracePeriod;Deleted;GraphReconciled;BackupsRotated;Cancelled
type Phase string

// Phases, in the order a request moves through them.
const (
	PhasePending         Phase = "Pending"
	PhasePlanned         Phase = "Planned"
	PhaseTombstoned      Phase = "Tombstoned"
	PhaseGracePeriod     Phase = "GracePeriod"
	PhaseDeleted         Phase = "Deleted"
	PhaseGraphReconciled Phase = "GraphReconciled"
	PhaseBackupsRotated  Phase = "BackupsRotated"
	PhaseCancelled       Phase = "Cancelled"
)

// Final reports whether the phase machine ends at p: BackupsRotated (the
// erasure done; re-verification goes on and records what it finds in the
// history, not in the phase), Cancelled, or Planned (a dry run).
func (p Phase) Final() bool {
	switch p {
	case PhaseBackupsRotated, PhaseCancelled, PhasePlanned:
		return true
	}
	return false
}

// A planning request is a dry-run ErasureRequest that `kubectl erasure plan`
// creates and deletes again. It carries LabelPlan=true and, in
// AnnotationPlanExpiresAt (RFC 3339), when the plugin is done with it; should
// the plugin be killed before deleting it, the manager deletes it once that
// time and its own PlanTTL after the plan have passed.
const (
	LabelPlan               = "erasure.lethe.dev/plan"
	AnnotationPlanExpiresAt = "erasure.lethe.dev/plan-expires-at"
)

// ErasureRequest condition types: one per step, plus Ready, Stalled and
// Reconciling (the three kstatus reads: Flux and other GitOps tools).
const (
	ConditionTombstoned         = "Tombstoned"
	ConditionGracePeriodElapsed = "GracePeriodElapsed"
	ConditionDeleted            = "Deleted"
	ConditionGraphReconciled    = "GraphReconciled"
	ConditionBackupsRotated     = "BackupsRotated"
	ConditionReady              = "Ready"
	ConditionStalled            = "Stalled"
	// ConditionReconciling is True while a step works or waits on something
	// that ends by itself (the grace period, backups expiring, a replica, an
	// unreachable database); False once the request is done, stopped, or
	// stalled on a human.
	ConditionReconciling = "Reconciling"
)

// ErasureRequest condition reasons.
const (
	ReasonStoreNotFound = "StoreNotFound"
	ReasonStoreNotReady = "StoreNotReady"
	// ReasonSchemaChanged: the schema the deletion's own transaction reads
	// breaks the audit's rules (a table added since the last audit).
	ReasonSchemaChanged = "SchemaChanged"
	// ReasonGracePeriodTooShort: spec.gracePeriod is below the manager's
	// minimum (--min-grace-period) and the request is not immediate.
	ReasonGracePeriodTooShort = "GracePeriodTooShort"
	// ReasonDeadlineAtRisk: the grace period plus the store's rotation
	// window end after the request's deadline.
	ReasonDeadlineAtRisk      = "DeadlineAtRisk"
	ReasonDatabaseUnavailable = "DatabaseUnavailable"
	ReasonSessionsTombstoned  = "SessionsTombstoned"
	ReasonNoSessionsFound     = "NoSessionsFound"
	ReasonWaitingForGrace     = "WaitingForGracePeriod"
	ReasonGraceElapsed        = "GracePeriodElapsed"
	ReasonImmediate           = "Immediate"
	ReasonCancelled           = "Cancelled"
	// ReasonCancelledInDatabase: the database holds a Cancelled receipt for a request whose spec
	// does not cancel it (its tombstones were lifted as if it were gone); it is not tombstoned again.
	ReasonCancelledInDatabase = "CancelledInDatabase"
	ReasonDryRun              = "DryRun"
	ReasonDeleting            = "Deleting"
	ReasonSessionsDeleted     = "SessionsDeleted"
	ReasonResidueFound        = "ResidueFound"
	ReasonReplicaLagging      = "ReplicaLagging"
	ReasonVerificationFailed  = "VerificationFailed"
	ReasonGraphUnavailable    = "GraphUnavailable"
	ReasonGraphPruned         = "GraphPruned"
	ReasonGraphPruning        = "GraphPruning"
	ReasonBackupsExpiring     = "BackupsExpiring"
	ReasonBackupsGone         = "BackupsGone"
	// ReasonBackupDeletionFailed: Velero processed a DeleteBackupRequest
	// Lethe created and could not delete the Backup (its status.errors).
	// Lethe does not ask again while that request exists (a human fixes the
	// cause and deletes it; Velero itself removes processed requests after
	// a day).
	ReasonBackupDeletionFailed = "BackupDeletionFailed"
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonCompleted            = "Completed"
	ReasonInProgress           = "InProgress"
	ReasonResurrected          = "Resurrected"
	// ReasonSigningKeyUnavailable: the configured receipt signing key
	// cannot be read; every history entry is signed, so the request waits.
	ReasonSigningKeyUnavailable = "SigningKeyUnavailable"
	ReasonNoActionNeeded        = "NoActionNeeded"
	// ReasonProgressing is Reconciling's reason when the next step has not
	// reported yet; otherwise Reconciling carries that step's own reason.
	ReasonProgressing = "Progressing"
)

// TableCount is a row count for one table.
type TableCount struct {
	// table, schema-qualified.
	// +kubebuilder:validation:MaxLength=256
	Table string `json:"table"`
	// rows counted.
	Rows int64 `json:"rows"`
}

// ErasurePlan is what an erasure will remove, taken when the sessions are tombstoned.
type ErasurePlan struct {
	// sessionsFound is the number of requested sessions that exist for the store's tenant.
	SessionsFound int32 `json:"sessionsFound"`
	// notFoundSessionIDs are requested IDs with no session of this tenant. They are never touched.
	// +kubebuilder:validation:MaxItems=1000
	// +listType=atomic
	// +optional
	NotFoundSessionIDs []SessionID `json:"notFoundSessionIDs,omitempty"`
	// rows per table that cascades from sessions (the sessions table included).
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Rows []TableCount `json:"rows,omitempty"`
	// embeddings is the number of non-null vectors on the rows above.
	Embeddings int64 `json:"embeddings"`
	// contentIndexEntries is the number of content-keyed cache entries of the sessions' content.
	ContentIndexEntries int64 `json:"contentIndexEntries"`
	// derivedRecords is the number of derived records whose lineage names a session.
	DerivedRecords int64 `json:"derivedRecords"`
	// graphNodes and graphRelationships derived only from the sessions.
	// +optional
	GraphNodes int64 `json:"graphNodes,omitempty"`
	// +optional
	GraphRelationships int64 `json:"graphRelationships,omitempty"`
	// backups that may hold the data.
	// +optional
	Backups int32 `json:"backups,omitempty"`
	// plannedAt is the database's clock when the plan was taken.
	// +optional
	PlannedAt *metav1.Time `json:"plannedAt,omitempty"`
}

// StepEvidence is what one step actually did.
type StepEvidence struct {
	// step is the condition type of the step.
	// +kubebuilder:validation:MaxLength=64
	Step string `json:"step"`
	// startedAt and completedAt are read from the database's clock where the step ran there.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// counts of what was removed or changed, by table, label or kind.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Counts []TableCount `json:"counts,omitempty"`
	// verification says what was looked for afterwards and found absent.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Verification []Verification `json:"verification,omitempty"`
	// backups are the Velero Backups that may hold the erased data (BackupsRotated step).
	// +kubebuilder:validation:MaxItems=1000
	// +listType=atomic
	// +optional
	Backups []BackupEvidence `json:"backups,omitempty"`
	// note is a short statement without personal data, e.g. "probed 50 of 4000 embeddings".
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Note string `json:"note,omitempty"`
	// vacuumedAt is when the tables the deletion touched were vacuumed
	// (Deleted step; the database's clock): from then on the erased tuples
	// are not readable from the data files (see the store's spec.postgres.vacuum).
	// +optional
	VacuumedAt *metav1.Time `json:"vacuumedAt,omitempty"`
}

// BackupEvidence is one Velero Backup that started before the deletion committed
// and so may hold the erased sessions.
type BackupEvidence struct {
	// name of the Backup in the store's Velero namespace.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// startedAt is the Backup's status.startTimestamp.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// originalExpiration is the expiration the Backup had before Lethe changed it.
	// +optional
	OriginalExpiration *metav1.Time `json:"originalExpiration,omitempty"`
	// expiration is the expiration after Lethe's change (never later than the original).
	// +optional
	Expiration *metav1.Time `json:"expiration,omitempty"`
	// deleteBackupRequest names the DeleteBackupRequest Lethe created (immediate requests).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	DeleteBackupRequest string `json:"deleteBackupRequest,omitempty"`
	// goneAt is when Lethe first found the Backup gone.
	// +optional
	GoneAt *metav1.Time `json:"goneAt,omitempty"`
}

// Verification is one check run after a step.
type Verification struct {
	// check names what was looked for, e.g. "rows referencing sessions in memory.facts".
	// +kubebuilder:validation:MaxLength=256
	Check string `json:"check"`
	// found is how many were found; 0 means verified absent.
	Found int64 `json:"found"`
}

// ErasureEvidence is what the steps did, one entry per step that ran.
type ErasureEvidence struct {
	// steps in the order they ran.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Steps []StepEvidence `json:"steps,omitempty"`
}

// HistoryEntry is one transition of the request. Entries form a hash chain:
// under status.evidenceFormat lethe.dev/evidence/v1 the digest is sha256 of
// the canonical JSON (RFC 8785) of the entry's fields, the request's UID and
// the format, and the signature is the manager's ed25519 signature of it
// (docs/evidence-format.md).
type HistoryEntry struct {
	// phase reached.
	Phase Phase `json:"phase"`
	// event names what happened when it is not a plain transition (Immediate, Resurrected, ...).
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Event string `json:"event,omitempty"`
	// time of the transition.
	Time metav1.Time `json:"time"`
	// evidenceDigest is the sha256 of the evidence recorded with this entry.
	// +kubebuilder:validation:MaxLength=71
	EvidenceDigest string `json:"evidenceDigest"`
	// evidenceParts is the digest of each part of the evidence when the
	// entry was written ("plan" and one per step), covered by evidenceDigest.
	// +kubebuilder:validation:MaxProperties=16
	// +optional
	EvidenceParts map[string]string `json:"evidenceParts,omitempty"`
	// previousDigest is the digest of the entry before (empty for the first).
	// +kubebuilder:validation:MaxLength=71
	// +optional
	PreviousDigest string `json:"previousDigest,omitempty"`
	// digest of this entry.
	// +kubebuilder:validation:MaxLength=71
	Digest string `json:"digest"`
	// keyID of the key that signed the entry (covered by the digest); empty when unsigned.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	KeyID string `json:"keyID,omitempty"`
	// signature is the base64 ed25519 signature of the entry's digest.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Signature string `json:"signature,omitempty"`
}

// Receipt is the signed statement over the final history digest.
type Receipt struct {
	// digest is the final history digest the receipt covers.
	// +kubebuilder:validation:MaxLength=71
	Digest string `json:"digest"`
	// envelope is the DSSE envelope (JSON) around the in-toto statement.
	// +kubebuilder:validation:MaxLength=16384
	// +optional
	Envelope string `json:"envelope,omitempty"`
	// keyID of the signing key; empty when the receipt is unsigned.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	KeyID string `json:"keyID,omitempty"`
	// issuedAt is when the receipt was made.
	// +optional
	IssuedAt *metav1.Time `json:"issuedAt,omitempty"`
	// log is the receipt's place in its store's append-only receipt log.
	// +optional
	Log *LogInclusion `json:"log,omitempty"`
}

// LogInclusion proves that the store's receipt log holds this request's
// receipt: the leaf at index, under a signed checkpoint (C2SP
// tlog-checkpoint) of the log at a size that includes it.
type LogInclusion struct {
	// index of the receipt's leaf in the log.
	Index int64 `json:"index"`
	// historyLength is the length of the history whose head the leaf records.
	HistoryLength int32 `json:"historyLength"`
	// checkpoint is the signed note of the log at a size past index.
	// +kubebuilder:validation:MaxLength=2048
	Checkpoint string `json:"checkpoint"`
	// inclusionProof is the RFC 6962 audit path, base64 hashes.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	InclusionProof []string `json:"inclusionProof,omitempty"`
}

// ErasureRequestStatus is what Lethe did and found. history is append-only.
type ErasureRequestStatus struct {
	// observedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase is the last milestone reached, derived from the conditions.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// conditions: Tombstoned, GracePeriodElapsed, Deleted, GraphReconciled, BackupsRotated, Ready, Stalled, Reconciling.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// sessions is the number of session IDs in the request.
	// +optional
	Sessions int32 `json:"sessions,omitempty"`

	// deadline is one calendar month after requestedAt (GDPR Art. 12(3)).
	// +optional
	Deadline *metav1.Time `json:"deadline,omitempty"`

	// graceEndsAt is when deletion may start, by the database's clock.
	// +optional
	GraceEndsAt *metav1.Time `json:"graceEndsAt,omitempty"`

	// plan is what the erasure will remove.
	// +optional
	Plan *ErasurePlan `json:"plan,omitempty"`

	// evidence is what each step actually did.
	// +optional
	Evidence *ErasureEvidence `json:"evidence,omitempty"`

	// evidenceFormat is the format of the history's digests and signatures,
	// set with the first entry and never changed; empty: the legacy chain.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	EvidenceFormat string `json:"evidenceFormat,omitempty"`

	// history is the append-only hash chain of transitions.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	History []HistoryEntry `json:"history,omitempty"`

	// receipt is the signed statement made at completion.
	// +optional
	Receipt *Receipt `json:"receipt,omitempty"`
}

// ErasureRequest asks Lethe to erase a set of sessions from a MemoryStore:
// tombstone, wait out the grace period, delete, prune the graph, rotate backups.
//
// The root rule keeps status.history append-only: the old history must be
// an exact prefix of the new one, entry by entry, so edits, removals,
// reorderings and insertions are all refused. It sits on the root, not on
// the list or on status, because a rule there is bypassed by removing the
// field or the whole status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=erasure;er,categories=lethe
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.history) || (has(self.status) && has(self.status.history) && self.status.history.size() >= oldSelf.status.history.size() && oldSelf.status.history.all(i, e, self.status.history[i] == e))",message="status.history is append-only: the old history must stay an exact prefix of the new one (no entry edited, removed, reordered or inserted)"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.evidenceFormat) || (has(self.status) && has(self.status.evidenceFormat) && self.status.evidenceFormat == oldSelf.status.evidenceFormat)",message="status.evidenceFormat may not change once set"
// +kubebuilder:validation:XValidation:rule="(has(oldSelf.status) && has(oldSelf.status.history) && size(oldSelf.status.history) > 0) || !has(self.status) || !has(self.status.history) || size(self.status.history) == 0 || (has(self.status.evidenceFormat) && self.status.evidenceFormat == 'lethe.dev/evidence/v1')",message="a history begins with status.evidenceFormat lethe.dev/evidence/v1 (the legacy, unkeyed format is only read)"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Sessions",type=integer,JSONPath=`.status.sessions`
// +kubebuilder:printcolumn:name="Deadline",type=string,JSONPath=`.status.deadline`
// +kubebuilder:printcolumn:name="Grace ends",type=string,JSONPath=`.status.graceEndsAt`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ErasureRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ErasureRequestSpec   `json:"spec"`
	Status ErasureRequestStatus `json:"status,omitempty"`
}

// ErasureRequestList is a list of ErasureRequests.
//
// +kubebuilder:object:root=true
type ErasureRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ErasureRequest `json:"items"`
}
