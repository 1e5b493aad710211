package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MemoryStore condition types.
const (
	// MemoryStorePostgresReady: the primary (and every configured replica) accepts connections.
	MemoryStorePostgresReady = "PostgresReady"
	// MemoryStoreSchemaCompliant: the decision record's validation queries found no violation.
	MemoryStoreSchemaCompliant = "SchemaCompliant"
	// MemoryStoreGraphReady: FalkorDB answers and the graph is reachable (or not configured).
	MemoryStoreGraphReady = "GraphReady"
	// MemoryStoreBackupsReady: Velero's CRDs are installed (or Velero is not configured).
	MemoryStoreBackupsReady = "BackupsReady"
	// MemoryStoreReady summarises the others.
	MemoryStoreReady = "Ready"
	// MemoryStoreErasuresIntact: the database still holds every erasure the
	// store's requests completed (False, RestoreDetected, after a restore of
	// the database brought erased sessions or took ledger rows back; False,
	// ErasureKeyChanged, when the database's erasure key is not the one the
	// store's record says they were taken under). It is not part of Ready:
	// the requests erase again by themselves, and new erasures hold under a
	// new key; an alert asks a human to put a changed key back.
	MemoryStoreErasuresIntact = "ErasuresIntact"
	// MemoryStoreRedactionCompliant: every column spec.postgres.redactedColumns
	// names has Lethe's redaction trigger, enabled, and a bounded sample of
	// its rows holds no value a detector finds (counts per detector in the
	// message, never a value). Not part of Ready: it concerns what is
	// stored, not what Lethe can erase.
	MemoryStoreRedactionCompliant = "RedactionCompliant"
	// MemoryStoreReceiptLogConsistent: the store's receipt log (in its
	// database) extends every signed checkpoint its requests hold (in the
	// cluster, out of the database's reach): no receipt a checkpoint covers
	// was removed or changed. Checked by every audit, not only when a
	// request completes. Not part of Ready: erasure goes on; Lethe signs no
	// checkpoint of a log that fails it.
	MemoryStoreReceiptLogConsistent = "ReceiptLogConsistent"
	// MemoryStoreParametersUnlogged: the database server writes no bind
	// parameter of the manager's statements to its log
	// (log_parameter_max_length and log_parameter_max_length_on_error are
	// 0 in the manager's sessions). After a deletion the manager sends, as
	// parameters, samples of what it erased (text passages, embeddings,
	// content hashes) for its checks; a server log that keeps them keeps
	// erased data out of Lethe's reach. False names the settings and the
	// statement that fixes them. Not part of Ready: erasure goes on.
	MemoryStoreParametersUnlogged = "ParametersUnlogged"
)

// MemoryStore condition reasons.
const (
	ReasonConnected          = "Connected"
	ReasonConnectionFailed   = "ConnectionFailed"
	ReasonSecretNotFound     = "SecretNotFound"
	ReasonSecretKeyMissing   = "SecretKeyMissing"
	ReasonInvalidSecret      = "InvalidSecret"
	ReasonCompliant          = "Compliant"
	ReasonViolationsFound    = "ViolationsFound"
	ReasonSchemaCheckFailed  = "SchemaCheckFailed"
	ReasonPostgresNotReady   = "PostgresNotReady"
	ReasonNotConfigured      = "NotConfigured"
	ReasonVeleroNotInstalled = "VeleroNotInstalled"
	ReasonVeleroInstalled    = "VeleroInstalled"
	ReasonAllReady           = "AllReady"
	ReasonNotReady           = "NotReady"
	ReasonErasuresHeld       = "ErasuresHeld"
	ReasonRestoreDetected    = "RestoreDetected"
	// ReasonErasureKeyChanged: the database's erasure key is not the one
	// the store's record says its erasures were taken under; erasing again
	// cannot mend it, putting the key back does.
	ReasonErasureKeyChanged  = "ErasureKeyChanged"
	ReasonErasureCheckFailed = "ErasureCheckFailed"
	// RedactionCompliant reasons.
	ReasonRedacted                = "Redacted"
	ReasonRedactionTriggerMissing = "RedactionTriggerMissing"
	ReasonUnredactedValuesFound   = "UnredactedValuesFound"
	ReasonRedactionCheckFailed    = "RedactionCheckFailed"
	// ReceiptLogConsistent reasons (and NotConfigured, PostgresNotReady).
	ReasonLogExtendsCheckpoints  = "LogExtendsCheckpoints"
	ReasonNoCheckpointsHeld      = "NoCheckpointsHeld"
	ReasonReceiptLogInconsistent = "ReceiptLogInconsistent"
	ReasonReceiptLogCheckFailed  = "ReceiptLogCheckFailed"
	ReasonCheckpointsUnverified  = "CheckpointsUnverified"
	// ParametersUnlogged reasons (and PostgresNotReady).
	ReasonParameterLoggingOff         = "ParameterLoggingOff"
	ReasonParametersLogged            = "ParametersLogged"
	ReasonParameterLoggingCheckFailed = "ParameterLoggingCheckFailed"
)

// Schema violation rules, named after the decision record's validation queries.
const (
	// RuleMissingTable: an expected table of the memory schema does not exist.
	RuleMissingTable = "MissingTable"
	// RuleNoCascade: a table with a session_id column has no ON DELETE CASCADE foreign key to sessions.
	RuleNoCascade = "NoCascade"
	// RuleVectorOffCascade: a vector column sits on a table that does not cascade from sessions.
	RuleVectorOffCascade = "VectorOffCascade"
	// RuleNonCascadingKey: a foreign key (any schema, any column) to sessions, or to a table that
	// cascades from it, deletes with another action than CASCADE: the referencing row outlives the session.
	RuleNonCascadingKey = "NonCascadingKey"
	// RuleRowSecurityDisabled: sessions, a table cascading from it, a derived table or a content
	// index has row-level security off: a raw query reads tombstoned sessions.
	RuleRowSecurityDisabled = "RowSecurityDisabled"
	// RuleRowSecurityNotForced: such a table's row-level security is not forced: its owner reads
	// tombstoned sessions.
	RuleRowSecurityNotForced = "RowSecurityNotForced"
	// RuleMissingPolicy: such a table has row-level security on and no permissive policy.
	RuleMissingPolicy = "MissingPolicy"
	// RuleMissingLineageGuard: a registered lineage table has no enabled lethe.refuse_erased_lineage
	// trigger on its source column: a derivation from an erased session is not refused.
	RuleMissingLineageGuard = "MissingLineageGuard"
	// RuleMissingLineageRequirement: a registered derived table has no enabled lethe.require_lineage
	// trigger: a derived record without lineage escapes the guard and the deletion.
	RuleMissingLineageRequirement = "MissingLineageRequirement"
	// RuleMissingSourceGuard: a column registered in lethe.source_columns has no enabled
	// lethe.refuse_erased_source trigger on insert and on update of it: re-ingesting an erased
	// transcript is not refused.
	RuleMissingSourceGuard = "MissingSourceGuard"
	// RuleEmptyRegistry: lethe.content_indexes or lethe.lineage_tables has no row (or does not exist):
	// Lethe cleans only the content-keyed and derived tables registered there.
	RuleEmptyRegistry = "EmptyRegistry"
)

// PostgresSpec says how to reach the memory database.
type PostgresSpec struct {
	// dsnSecretRef names the Secret key holding the primary's DSN
	// (postgres://user:pass@host:port/db?sslmode=...).
	// +required
	DSNSecretRef SecretKeyRef `json:"dsnSecretRef"`

	// schema is the Postgres schema of the memory tables.
	// +kubebuilder:default=memory
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]*$`
	// +optional
	Schema string `json:"schema,omitempty"`

	// replicas are read replicas that must have replayed an erasure before it counts as done.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	Replicas []PostgresReplica `json:"replicas,omitempty"`

	// residueProbeExclude names the schemas ("analytics") and tables
	// ("public.glossary") that the residue probes (near-identical
	// embeddings, verbatim text) skip after a deletion: copies there are
	// not looked for. Every other schema the manager's role can read is
	// probed. The Deleted step's evidence counts the text columns excluded.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=127
	// +kubebuilder:validation:items:Pattern=`^[^.]{1,63}(\.[^.]{1,63})?$`
	// +listType=set
	// +optional
	ResidueProbeExclude []string `json:"residueProbeExclude,omitempty"`

	// vacuum is how the tables a deletion touched are vacuumed once it is
	// done, so that the erased rows stop being readable from the data
	// files: Lazy (the default) removes their tuples and index entries
	// without blocking the application (the pages' free space may keep
	// their bytes until reused); Full rewrites each table and its indexes
	// (an exclusive lock on each table while it runs); Off leaves it to
	// autovacuum. The role needs to own the tables (PostgreSQL 15 and 16)
	// or hold MAINTAIN on them (17 and later); tables it may not vacuum are
	// counted in the evidence.
	// +kubebuilder:validation:Enum=Lazy;Full;Off
	// +kubebuilder:default=Lazy
	// +optional
	Vacuum VacuumMode `json:"vacuum,omitempty"`

	// redactedColumns are the text columns ("schema.table.column") whose
	// values the database redacts at insert (lethe.redact_column installs
	// the trigger). The store's audit checks each has the trigger, enabled,
	// and samples it for values a detector finds (RedactionCompliant).
	// Unset or empty: the reference schema's memory.rounds.assistant_thinking.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:Pattern=`^[a-z_][a-z0-9_]{0,62}\.[a-z_][a-z0-9_]{0,62}\.[a-z_][a-z0-9_]{0,62}$`
	// +listType=set
	// +optional
	RedactedColumns []string `json:"redactedColumns,omitempty"`
}

// DefaultRedactedColumn is the reference schema's reasoning column.
const DefaultRedactedColumn = "memory.rounds.assistant_thinking"

// RedactedColumnsOrDefault are the columns the store's audit checks for
// redaction: the reference column when the field is unset.
func (p PostgresSpec) RedactedColumnsOrDefault() []string {
	if len(p.RedactedColumns) == 0 {
		return []string{DefaultRedactedColumn}
	}
	return p.RedactedColumns
}

// VacuumMode is how a deletion's tables are vacuumed after it.
type VacuumMode string

// Vacuum modes.
const (
	VacuumLazy VacuumMode = "Lazy"
	VacuumFull VacuumMode = "Full"
	VacuumOff  VacuumMode = "Off"
)

// PostgresReplica is one read replica of the memory database.
type PostgresReplica struct {
	// dsnSecretRef names the Secret key holding the replica's DSN.
	// +required
	DSNSecretRef SecretKeyRef `json:"dsnSecretRef"`
}

// FalkorDBSpec says how to reach the knowledge graph derived from the memory.
type FalkorDBSpec struct {
	// urlSecretRef names the Secret key holding falkor://[user:pass@]host:port.
	// +required
	URLSecretRef SecretKeyRef `json:"urlSecretRef"`

	// graph is the name of the graph key.
	// +kubebuilder:default=memory
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_:.-]+$`
	// +optional
	Graph string `json:"graph,omitempty"`

	// sweepInterval is how often the full reconciliation from Postgres runs.
	// +kubebuilder:default="168h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('1m')",message="sweepInterval must be a Go duration of at least 1m, such as 168h"
	// +optional
	SweepInterval *metav1.Duration `json:"sweepInterval,omitempty"`

	// personLabel marks the entities that are persons: those with this
	// label beside Entity. Each store audit makes their names the graph's
	// part of the database's names dictionary (lethe.redaction_names),
	// which the redaction trigger replaces with [person]; a name the graph
	// no longer holds leaves it. Empty: the graph feeds no names.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_]*$`
	// +optional
	PersonLabel string `json:"personLabel,omitempty"`
}

// VeleroSpec says which Velero backups may hold this store's data.
type VeleroSpec struct {
	// namespace where Velero keeps its Backup objects.
	// +kubebuilder:default=velero
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// backupSelector selects the Backups that may hold this store's data.
	// An empty selector matches every Backup in the namespace.
	// +required
	BackupSelector metav1.LabelSelector `json:"backupSelector"`

	// rotationWindow is the longest a backup holding erased data may live after the deletion.
	// +kubebuilder:default="720h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('0s')",message="rotationWindow must be a non-negative Go duration such as 720h"
	// +optional
	RotationWindow *metav1.Duration `json:"rotationWindow,omitempty"`

	// clockSkew is the most Velero's clock (which stamps a Backup's start)
	// may differ from the memory database's (which stamps the deletion's
	// commit): a Backup that started up to clockSkew after the deletion
	// committed is taken to hold the erased data too.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('0s')",message="clockSkew must be a non-negative Go duration such as 5m"
	// +optional
	ClockSkew *metav1.Duration `json:"clockSkew,omitempty"`

	// deleteOnImmediate lets an immediate request ask Velero to delete the
	// Backups that may hold its data (a DeleteBackupRequest each). A Backup
	// of a shared database holds every tenant's data: the platform team that
	// owns the store decides. Off (the default), an immediate request
	// shortens the Backups' expiration like any other.
	// +optional
	DeleteOnImmediate bool `json:"deleteOnImmediate,omitempty"`

	// minRetention is the shortest a Backup is kept after it started: Lethe
	// never shortens a Backup's expiration below its start plus minRetention
	// (a disaster-recovery floor), even when that passes a request's
	// deadline; the request then says so. Empty: no floor.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('0s')",message="minRetention must be a non-negative Go duration such as 168h"
	// +optional
	MinRetention *metav1.Duration `json:"minRetention,omitempty"`
}

// MemoryStoreSpec describes one memory system and how to reach its layers.
type MemoryStoreSpec struct {
	// tenantID, when set, restricts every statement Lethe runs to
	// memory.sessions.tenant_id = tenantID.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`
	// +optional
	TenantID string `json:"tenantID,omitempty"`

	// postgres is the memory database (required).
	// +required
	Postgres PostgresSpec `json:"postgres"`

	// falkordb is the knowledge graph; omit it when the store has none.
	// +optional
	FalkorDB *FalkorDBSpec `json:"falkordb,omitempty"`

	// velero describes the backups of the store; omit it when none are taken with Velero.
	// +optional
	Velero *VeleroSpec `json:"velero,omitempty"`
}

// SchemaViolation is one finding of the schema audit.
type SchemaViolation struct {
	// rule that was broken (MissingTable, NoCascade, VectorOffCascade, NonCascadingKey,
	// RowSecurityDisabled, RowSecurityNotForced, MissingPolicy, MissingLineageGuard,
	// MissingLineageRequirement, MissingSourceGuard, EmptyRegistry).
	// +kubebuilder:validation:MaxLength=64
	Rule string `json:"rule"`
	// table the finding is about (schema-qualified).
	// +kubebuilder:validation:MaxLength=256
	Table string `json:"table"`
	// column, when the finding is about one.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Column string `json:"column,omitempty"`
	// message says what is wrong in words.
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message"`
}

// SchemaStatus is what the schema audit found.
type SchemaStatus struct {
	// cascadingTables are the tables with an ON DELETE CASCADE foreign key to sessions.
	// +listType=atomic
	// +optional
	CascadingTables []string `json:"cascadingTables,omitempty"`
	// vectorColumns are the pgvector columns of the memory schema, as table.column.
	// +listType=atomic
	// +optional
	VectorColumns []string `json:"vectorColumns,omitempty"`
	// violations found; empty when the schema is compliant.
	// +listType=atomic
	// +optional
	Violations []SchemaViolation `json:"violations,omitempty"`
	// checkedAt is when the audit last ran.
	// +optional
	CheckedAt *metav1.Time `json:"checkedAt,omitempty"`
}

// MemoryStoreStatus is what Lethe observed of the store.
type MemoryStoreStatus struct {
	// observedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: PostgresReady, SchemaCompliant, GraphReady, BackupsReady, Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// schema is the result of the schema audit.
	// +optional
	Schema *SchemaStatus `json:"schema,omitempty"`

	// lastSweep is when the full graph reconciliation last completed.
	// +optional
	LastSweep *metav1.Time `json:"lastSweep,omitempty"`

	// graphSweep is what the last full graph reconciliation attempt checked and removed.
	// +optional
	GraphSweep *GraphSweepStatus `json:"graphSweep,omitempty"`

	// heldSecrets names the Secrets (in the store's namespace) that may carry
	// this store's finalizer erasure.lethe.dev/store-secret.<its UID>: those
	// it reads, listed before the finalizer is put on. The finalizer keeps
	// each one until the store is released, so that a namespace deleted at
	// once cannot take the database's credentials before the requests and
	// the store have finished with them.
	// +listType=set
	// +optional
	HeldSecrets []string `json:"heldSecrets,omitempty"`
}

// Results of a graph sweep.
const (
	SweepCompleted = "Completed"
	// SweepRefused: more orphans than the manager's limit; nothing was removed.
	SweepRefused = "Refused"
	SweepFailed  = "Failed"
)

// GraphSweepStatus is one full reconciliation of the graph from Postgres:
// elements whose provenance no longer exists there are removed.
type GraphSweepStatus struct {
	// result is Completed, Refused (too many orphans: nothing removed) or Failed.
	// +kubebuilder:validation:Enum=Completed;Refused;Failed
	Result string `json:"result"`
	// message says why a sweep was refused or failed.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
	// startedAt and completedAt of the attempt.
	StartedAt metav1.Time `json:"startedAt"`
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// sessionsChecked and factsChecked are the distinct provenance IDs found in the graph.
	SessionsChecked int64 `json:"sessionsChecked"`
	FactsChecked    int64 `json:"factsChecked"`
	// orphanSessions and orphanFacts had no row in Postgres.
	OrphanSessions int64 `json:"orphanSessions"`
	OrphanFacts    int64 `json:"orphanFacts"`
	// provenancelessNodes and provenancelessRelationships are the graph
	// elements without provenance (no session or fact ID to check against
	// Postgres) that a completed sweep left: attached to live data, they are
	// kept, but nothing attests them. Those attached only to erased data are
	// removed and counted in removed.
	// +optional
	ProvenancelessNodes int64 `json:"provenancelessNodes,omitempty"`
	// provenancelessRelationships: see provenancelessNodes.
	// +optional
	ProvenancelessRelationships int64 `json:"provenancelessRelationships,omitempty"`
	// removed counts the nodes and relationships removed, by label and type.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Removed []TableCount `json:"removed,omitempty"`
}

// MemoryStore describes one LLM memory system (Postgres, FalkorDB, Velero) that
// ErasureRequests in this namespace act on.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mstore,categories=lethe
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Postgres",type=string,JSONPath=`.status.conditions[?(@.type=="PostgresReady")].status`
// +kubebuilder:printcolumn:name="Schema",type=string,JSONPath=`.status.conditions[?(@.type=="SchemaCompliant")].reason`
// +kubebuilder:printcolumn:name="Graph",type=string,JSONPath=`.status.conditions[?(@.type=="GraphReady")].reason`
// +kubebuilder:printcolumn:name="Backups",type=string,JSONPath=`.status.conditions[?(@.type=="BackupsReady")].reason`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MemoryStore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MemoryStoreSpec   `json:"spec"`
	Status MemoryStoreStatus `json:"status,omitempty"`
}

// MemoryStoreList is a list of MemoryStores.
//
// +kubebuilder:object:root=true
type MemoryStoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MemoryStore `json:"items"`
}
