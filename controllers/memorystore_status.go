package controllers

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/storerecord"
)

// storeFacts is what one pass of the MemoryStore reconciler observed. The
// conditions are computed from it by pure functions; nothing else decides them.
type storeFacts struct {
	// postgres is nil when the primary and every replica answered.
	postgres *failure
	// schema is the audit's report; nil when it could not run.
	schema *postgres.SchemaReport
	// schemaErr is set when the audit query itself failed.
	schemaErr error

	graphConfigured bool
	graph           *failure

	// restores are the requests whose erasures the database no longer holds;
	// erasuresErr is set when that could not be checked.
	restores    []erasure.RestoreFinding
	affected    []*lethev1.ErasureRequest
	erasuresErr error
	// underAnotherKey is how many requests hold keyed ledger rows under
	// another erasure key than the database has now.
	underAnotherKey int64
	// record is the store's erasure record as the check read it (nil when
	// it kept none or could not read it), for the mend after the check.
	record *storerecord.Record

	veleroConfigured bool
	veleroInstalled  bool
	velero           *failure

	// redaction is the audit of the redacted columns; redactionErr is set
	// when it could not run.
	redaction    []postgres.RedactedColumn
	redactionErr error
	// graphNames is how many names the graph feeds the names dictionary;
	// graphNamesErr is set when that sync failed.
	graphNames    int64
	graphNamesErr error
	// receiptLog is the check of the store's receipt log.
	receiptLog receiptLogFacts
	// paramLog is how the server logs the manager's statement parameters;
	// paramLogErr is set when that could not be read.
	paramLog    postgres.ParameterLogging
	paramLogErr error
}

// failure is a reason and a stable message (no timestamps, no counts that change).
type failure struct {
	reason  string
	message string
}

// asUnknown is c with status Unknown: a check that could not run.
func asUnknown(c metav1.Condition) metav1.Condition {
	c.Status = metav1.ConditionUnknown
	return c
}

func fail(reason, format string, args ...any) *failure {
	return &failure{reason: reason, message: fmt.Sprintf(format, args...)}
}

// storeConditions turns facts into the MemoryStore conditions.
func storeConditions(f storeFacts, generation int64) []metav1.Condition {
	cond := func(t string, ok bool, reason, msg string) metav1.Condition {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: generation}
	}
	var out []metav1.Condition

	if f.postgres != nil {
		out = append(out, cond(lethev1.MemoryStorePostgresReady, false, f.postgres.reason, f.postgres.message))
	} else {
		out = append(out, cond(lethev1.MemoryStorePostgresReady, true, lethev1.ReasonConnected, "the primary and every configured replica accept connections"))
	}

	switch {
	case f.postgres != nil:
		out = append(out, asUnknown(cond(lethev1.MemoryStoreSchemaCompliant, false, lethev1.ReasonPostgresNotReady, "the schema cannot be audited until Postgres is reachable")))
	case f.schemaErr != nil:
		out = append(out, asUnknown(cond(lethev1.MemoryStoreSchemaCompliant, false, lethev1.ReasonSchemaCheckFailed, "the schema audit queries failed: "+f.schemaErr.Error())))
	case f.schema != nil && !f.schema.Compliant():
		out = append(out, cond(lethev1.MemoryStoreSchemaCompliant, false, lethev1.ReasonViolationsFound, violationsMessage(f.schema.Violations)))
	default:
		out = append(out, cond(lethev1.MemoryStoreSchemaCompliant, true, lethev1.ReasonCompliant,
			"every table with session_id cascades from sessions, every vector column is on a cascading table, and the expected tables exist"))
	}

	switch {
	case !f.graphConfigured:
		out = append(out, cond(lethev1.MemoryStoreGraphReady, true, lethev1.ReasonNotConfigured, "no FalkorDB graph is configured"))
	case f.graph != nil:
		out = append(out, cond(lethev1.MemoryStoreGraphReady, false, f.graph.reason, f.graph.message))
	default:
		out = append(out, cond(lethev1.MemoryStoreGraphReady, true, lethev1.ReasonConnected, "FalkorDB answers with the graph module loaded"))
	}

	switch {
	case !f.veleroConfigured:
		out = append(out, cond(lethev1.MemoryStoreBackupsReady, true, lethev1.ReasonNotConfigured, "no Velero backups are configured"))
	case f.velero != nil:
		out = append(out, cond(lethev1.MemoryStoreBackupsReady, false, f.velero.reason, f.velero.message))
	case !f.veleroInstalled:
		out = append(out, cond(lethev1.MemoryStoreBackupsReady, false, lethev1.ReasonVeleroNotInstalled,
			"the velero.io/v1 Backup and DeleteBackupRequest CRDs are not installed; Lethe picks them up once they are"))
	default:
		out = append(out, cond(lethev1.MemoryStoreBackupsReady, true, lethev1.ReasonVeleroInstalled, "Velero's Backup and DeleteBackupRequest APIs are served"))
	}

	var notReady []string
	for _, c := range out {
		if c.Status != metav1.ConditionTrue {
			notReady = append(notReady, c.Type)
		}
	}
	if len(notReady) == 0 {
		out = append(out, cond(lethev1.MemoryStoreReady, true, lethev1.ReasonAllReady, "every configured layer is reachable and the schema is compliant"))
	} else {
		out = append(out, cond(lethev1.MemoryStoreReady, false, lethev1.ReasonNotReady, "not ready: "+strings.Join(notReady, ", ")))
	}
	return append(out, erasuresCondition(f, cond), redactionCondition(f, cond), receiptLogCondition(f, cond), parametersCondition(f, cond))
}

// parametersCondition is ParametersUnlogged: no statement parameter of the
// manager's role reaches the server's log. Its message names settings,
// the role and the fix, never a parameter.
func parametersCondition(f storeFacts, cond func(string, bool, string, string) metav1.Condition) metav1.Condition {
	p := f.paramLog
	switch {
	case f.postgres != nil:
		return asUnknown(cond(lethev1.MemoryStoreParametersUnlogged, false, lethev1.ReasonPostgresNotReady, "the server's logging cannot be checked until Postgres is reachable"))
	case f.paramLogErr != nil:
		return asUnknown(cond(lethev1.MemoryStoreParametersUnlogged, false, lethev1.ReasonParameterLoggingCheckFailed,
			"the server's logging settings could not be read: "+f.paramLogErr.Error()))
	case p.Unlogged():
		return cond(lethev1.MemoryStoreParametersUnlogged, true, lethev1.ReasonParameterLoggingOff,
			fmt.Sprintf("log_parameter_max_length and log_parameter_max_length_on_error are 0 in role %s's sessions, and no setting logs statement values: the samples of erased data the checks send stay out of the server's log", p.Role))
	}
	return cond(lethev1.MemoryStoreParametersUnlogged, false, lethev1.ReasonParametersLogged, parametersLoggedMessage(p))
}

// parametersLoggedMessage says which settings let role p.Role's statement
// parameters reach the server's log, whether statements are logged now,
// and the fix.
func parametersLoggedMessage(p postgres.ParameterLogging) string {
	var why []string
	if p.MaxLength != 0 {
		why = append(why, fmt.Sprintf("log_parameter_max_length = %d (%s) logs %s of each parameter of a logged statement",
			p.MaxLength, p.MaxLengthSource, logLength(p.MaxLength)))
	}
	if p.MaxLengthOnError != 0 {
		why = append(why, fmt.Sprintf("log_parameter_max_length_on_error = %d logs %s of those of a failing statement",
			p.MaxLengthOnError, logLength(p.MaxLengthOnError)))
	}
	if len(p.ValuesLoggedBy) > 0 {
		why = append(why, strings.Join(p.ValuesLoggedBy, ", ")+" write statement values to the log whatever those say")
	}
	now := "no statement is logged now, but turning statement logging on would log them"
	if len(p.LoggingNow) > 0 {
		now = "statements are logged now (" + strings.Join(p.LoggingNow, ", ") + ")"
	}
	return fmt.Sprintf("role %s's statement parameters, which after a deletion hold samples of erased data, can reach the server's log: %s; %s. Fix: %s",
		p.Role, strings.Join(why, "; "), now, p.Fix())
}

// logLength says how much of a parameter the server logs.
func logLength(n int64) string {
	if n < 0 {
		return "every byte"
	}
	return fmt.Sprintf("up to %d bytes", n)
}

// redactionCondition is RedactionCompliant: the redacted columns have
// their trigger and a sample free of detectable values. Its message names
// columns, detectors and counts, never a value.
func redactionCondition(f storeFacts, cond func(string, bool, string, string) metav1.Condition) metav1.Condition {
	var missing, leaked []string
	sampled := 0
	for _, c := range f.redaction {
		sampled += c.Sampled
		switch {
		case !c.Exists:
			missing = append(missing, c.Column+" (no such column)")
		case c.Problem != "":
			missing = append(missing, c.Column+" ("+c.Problem+")")
		case !c.Trigger:
			missing = append(missing, c.Column)
		}
		if n := c.Found.Total(); n > 0 {
			names := slices.Sorted(maps.Keys(c.Found))
			parts := make([]string, len(names))
			for i, name := range names {
				parts[i] = fmt.Sprintf("%d %s", c.Found[name], name)
			}
			leaked = append(leaked, fmt.Sprintf("%s: %s in %d sampled values", c.Column, strings.Join(parts, ", "), c.Sampled))
		}
	}
	switch {
	case f.postgres != nil:
		return asUnknown(cond(lethev1.MemoryStoreRedactionCompliant, false, lethev1.ReasonPostgresNotReady, "the redaction cannot be checked until Postgres is reachable"))
	case f.redactionErr != nil || f.graphNamesErr != nil:
		return asUnknown(cond(lethev1.MemoryStoreRedactionCompliant, false, lethev1.ReasonRedactionCheckFailed,
			"the redaction check or the names dictionary's sync with the graph could not run; it is retried on the next audit"))
	case len(missing) > 0:
		msg := "no redaction trigger that holds (lethe.redact_column) on " + strings.Join(missing, ", ")
		if len(leaked) > 0 {
			msg += "; " + strings.Join(leaked, "; ")
		}
		return cond(lethev1.MemoryStoreRedactionCompliant, false, lethev1.ReasonRedactionTriggerMissing, msg)
	case len(leaked) > 0:
		return cond(lethev1.MemoryStoreRedactionCompliant, false, lethev1.ReasonUnredactedValuesFound,
			strings.Join(leaked, "; ")+" (written before the trigger? kubectl erasure redact)")
	default:
		msg := redactedMessage(f.redaction, sampled)
		if f.graphNames > 0 {
			msg += fmt.Sprintf("; %d person names from the graph in the names dictionary", f.graphNames)
		}
		return cond(lethev1.MemoryStoreRedactionCompliant, true, lethev1.ReasonRedacted, msg)
	}
}

// redactedMessage says which columns are redacted at insert and what the
// sample showed, with no counts (they vary between audits, and the message
// would change every time): a sample with no value is not a clean one.
func redactedMessage(cols []postgres.RedactedColumn, sampled int) string {
	names := make([]string, len(cols))
	var skipped, empty []string
	for i, c := range cols {
		names[i] = c.Column
		switch {
		case c.NotSampled != "":
			skipped = append(skipped, c.Column+" ("+c.NotSampled+")")
		case c.Sampled == 0:
			empty = append(empty, c.Column)
		}
	}
	msg := strings.Join(names, ", ") + " redacted at insert; "
	switch {
	case sampled == 0:
		msg += "no value sampled, so none checked"
	case len(empty) > 0:
		msg += "no detectable value in the sample; no value sampled in " + strings.Join(empty, ", ")
	default:
		msg += "no detectable value in the sample"
	}
	if len(skipped) > 0 {
		msg += "; not sampled: " + strings.Join(skipped, ", ")
	}
	return msg
}

// erasuresCondition is ErasuresIntact: whether the database still holds
// what the store's requests erased. Its message has no counts, so it does
// not change between audits; the event and the requests' history have them.
func erasuresCondition(f storeFacts, cond func(string, bool, string, string) metav1.Condition) metav1.Condition {
	switch {
	case f.postgres != nil:
		return asUnknown(cond(lethev1.MemoryStoreErasuresIntact, false, lethev1.ReasonPostgresNotReady, "the erasures cannot be checked until Postgres is reachable"))
	case f.underAnotherKey > 0:
		// First: nothing mends it by itself, and the rest still runs.
		return cond(lethev1.MemoryStoreErasuresIntact, false, lethev1.ReasonErasureKeyChanged,
			"the database's erasure key (lethe.erasure_key) is not the one its erasure ledger's keyed hashes were taken under (a restore into a freshly migrated database?): "+
				"the ledger's keyed hashes match nothing, so erased transcripts are ingested again without LE002; put back the key row of the backup the ledger came from")
	case f.erasuresErr != nil:
		return asUnknown(cond(lethev1.MemoryStoreErasuresIntact, false, lethev1.ReasonErasureCheckFailed, "the erasure check could not run; it is retried on the next audit"))
	case len(f.restores) > 0:
		return cond(lethev1.MemoryStoreErasuresIntact, false, lethev1.ReasonRestoreDetected,
			"the database holds less erasure than the store's requests say (a restore?): erased sessions exist again or ledger rows are gone; the requests erase them again")
	default:
		return cond(lethev1.MemoryStoreErasuresIntact, true, lethev1.ReasonErasuresHeld,
			"every session the store's requests erased is absent and held erased by the ledger")
	}
}

// violationsMessage names every violation, in a stable order.
func violationsMessage(vs []postgres.Violation) string {
	parts := make([]string, 0, len(vs))
	for _, v := range vs {
		where := v.Table
		if v.Column != "" {
			where += "." + v.Column
		}
		parts = append(parts, v.Rule+" "+where)
	}
	slices.Sort(parts)
	return fmt.Sprintf("%d schema violation(s): %s", len(vs), strings.Join(parts, "; "))
}

// schemaStatus converts the audit report into the API's status shape.
func schemaStatus(rep *postgres.SchemaReport, checkedAt metav1.Time) *lethev1.SchemaStatus {
	if rep == nil {
		return nil
	}
	s := &lethev1.SchemaStatus{
		CascadingTables: rep.CascadingTables,
		VectorColumns:   rep.VectorColumns,
		CheckedAt:       &checkedAt,
	}
	for _, v := range rep.Violations {
		s.Violations = append(s.Violations, lethev1.SchemaViolation{Rule: v.Rule, Table: v.Table, Column: v.Column, Message: v.Message})
	}
	return s
}

// setConditions applies conds to the status; it returns true when one changed
// (LastTransitionTime moves only when the status itself changes).
func setConditions(dst *[]metav1.Condition, conds []metav1.Condition) bool {
	changed := false
	for _, c := range conds {
		if meta.SetStatusCondition(dst, c) {
			changed = true
		}
	}
	return changed
}
