package controllers

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/redact"
)

func TestStoreConditions(t *testing.T) {
	compliant := &postgres.SchemaReport{}
	broken := &postgres.SchemaReport{Violations: []postgres.Violation{
		{Rule: "NoCascade", Table: "memory.b", Column: "session_id"},
		{Rule: "MissingTable", Table: "memory.a"},
	}}
	type want struct{ status, reason string }
	cases := map[string]struct {
		facts storeFacts
		want  map[string]want
	}{
		"all ready, nothing optional configured": {
			facts: storeFacts{schema: compliant},
			want: map[string]want{
				lethev1.MemoryStorePostgresReady:   {"True", lethev1.ReasonConnected},
				lethev1.MemoryStoreSchemaCompliant: {"True", lethev1.ReasonCompliant},
				lethev1.MemoryStoreGraphReady:      {"True", lethev1.ReasonNotConfigured},
				lethev1.MemoryStoreBackupsReady:    {"True", lethev1.ReasonNotConfigured},
				lethev1.MemoryStoreReady:           {"True", lethev1.ReasonAllReady},
			},
		},
		"postgres down makes the schema unknown": {
			facts: storeFacts{postgres: fail(lethev1.ReasonConnectionFailed, "primary: refused")},
			want: map[string]want{
				lethev1.MemoryStorePostgresReady:   {"False", lethev1.ReasonConnectionFailed},
				lethev1.MemoryStoreSchemaCompliant: {"Unknown", lethev1.ReasonPostgresNotReady},
				lethev1.MemoryStoreReady:           {"False", lethev1.ReasonNotReady},
			},
		},
		"audit query failed": {
			facts: storeFacts{schemaErr: errors.New("permission denied")},
			want: map[string]want{
				lethev1.MemoryStoreSchemaCompliant: {"Unknown", lethev1.ReasonSchemaCheckFailed},
				lethev1.MemoryStoreReady:           {"False", lethev1.ReasonNotReady},
			},
		},
		"violations": {
			facts: storeFacts{schema: broken},
			want: map[string]want{
				lethev1.MemoryStoreSchemaCompliant: {"False", lethev1.ReasonViolationsFound},
				lethev1.MemoryStoreReady:           {"False", lethev1.ReasonNotReady},
			},
		},
		"graph down, velero missing": {
			facts: storeFacts{schema: compliant, graphConfigured: true, graph: fail(lethev1.ReasonConnectionFailed, "x"), veleroConfigured: true},
			want: map[string]want{
				lethev1.MemoryStoreGraphReady:   {"False", lethev1.ReasonConnectionFailed},
				lethev1.MemoryStoreBackupsReady: {"False", lethev1.ReasonVeleroNotInstalled},
				lethev1.MemoryStoreReady:        {"False", lethev1.ReasonNotReady},
			},
		},
		"graph and velero ready": {
			facts: storeFacts{schema: compliant, graphConfigured: true, veleroConfigured: true, veleroInstalled: true},
			want: map[string]want{
				lethev1.MemoryStoreGraphReady:     {"True", lethev1.ReasonConnected},
				lethev1.MemoryStoreBackupsReady:   {"True", lethev1.ReasonVeleroInstalled},
				lethev1.MemoryStoreReady:          {"True", lethev1.ReasonAllReady},
				lethev1.MemoryStoreErasuresIntact: {"True", lethev1.ReasonErasuresHeld},
			},
		},
		"a restore is reported, and leaves the store Ready": {
			facts: storeFacts{schema: compliant, restores: []erasure.RestoreFinding{{UID: "u", SessionsBack: 2}}},
			want: map[string]want{
				lethev1.MemoryStoreReady:          {"True", lethev1.ReasonAllReady},
				lethev1.MemoryStoreErasuresIntact: {"False", lethev1.ReasonRestoreDetected},
			},
		},
		"a redacted column without its trigger leaves the store Ready": {
			facts: storeFacts{schema: compliant, redaction: []postgres.RedactedColumn{{Column: "memory.rounds.assistant_thinking", Exists: true}}},
			want: map[string]want{
				lethev1.MemoryStoreReady:              {"True", lethev1.ReasonAllReady},
				lethev1.MemoryStoreRedactionCompliant: {"False", lethev1.ReasonRedactionTriggerMissing},
			},
		},
		"unredacted values in the sample": {
			facts: storeFacts{schema: compliant, redaction: []postgres.RedactedColumn{{Column: "memory.rounds.assistant_thinking", Exists: true, Trigger: true,
				Sampled: 200, Found: redact.Counts{"email": 2, "card": 1}}}},
			want: map[string]want{lethev1.MemoryStoreRedactionCompliant: {"False", lethev1.ReasonUnredactedValuesFound}},
		},
		"redacted": {
			facts: storeFacts{schema: compliant, redaction: []postgres.RedactedColumn{{Column: "memory.rounds.assistant_thinking", Exists: true, Trigger: true, Sampled: 200}}},
			want:  map[string]want{lethev1.MemoryStoreRedactionCompliant: {"True", lethev1.ReasonRedacted}},
		},
		"postgres down makes the redaction unknown": {
			facts: storeFacts{postgres: fail(lethev1.ReasonConnectionFailed, "primary: refused")},
			want:  map[string]want{lethev1.MemoryStoreRedactionCompliant: {"Unknown", lethev1.ReasonPostgresNotReady}},
		},
		"an inconsistent receipt log is reported, and leaves the store Ready": {
			facts: storeFacts{schema: compliant, receiptLog: receiptLogFacts{configured: true, held: 2, inconsistent: errors.New("receipts were removed")}},
			want: map[string]want{
				lethev1.MemoryStoreReady:                {"True", lethev1.ReasonAllReady},
				lethev1.MemoryStoreReceiptLogConsistent: {"False", lethev1.ReasonReceiptLogInconsistent},
			},
		},
		"a receipt log that extends the held checkpoints": {
			facts: storeFacts{schema: compliant, receiptLog: receiptLogFacts{configured: true, held: 2, checked: 2}},
			want:  map[string]want{lethev1.MemoryStoreReceiptLogConsistent: {"True", lethev1.ReasonLogExtendsCheckpoints}},
		},
		"a held checkpoint no published key opens is not counted as extended": {
			facts: storeFacts{schema: compliant, receiptLog: receiptLogFacts{configured: true, held: 2, checked: 1}},
			want:  map[string]want{lethev1.MemoryStoreReceiptLogConsistent: {"Unknown", lethev1.ReasonCheckpointsUnverified}},
		},
		"no checkpoint held yet": {
			facts: storeFacts{schema: compliant, receiptLog: receiptLogFacts{configured: true}},
			want:  map[string]want{lethev1.MemoryStoreReceiptLogConsistent: {"True", lethev1.ReasonNoCheckpointsHeld}},
		},
		"no signing key: no receipt log to check": {
			facts: storeFacts{schema: compliant},
			want:  map[string]want{lethev1.MemoryStoreReceiptLogConsistent: {"True", lethev1.ReasonNotConfigured}},
		},
		"a receipt log check that failed is Unknown": {
			facts: storeFacts{schema: compliant, receiptLog: receiptLogFacts{configured: true, held: 1, err: errors.New("timeout")}},
			want:  map[string]want{lethev1.MemoryStoreReceiptLogConsistent: {"Unknown", lethev1.ReasonReceiptLogCheckFailed}},
		},
		"postgres down makes the receipt log unknown": {
			facts: storeFacts{postgres: fail(lethev1.ReasonConnectionFailed, "primary: refused"), receiptLog: receiptLogFacts{configured: true}},
			want:  map[string]want{lethev1.MemoryStoreReceiptLogConsistent: {"Unknown", lethev1.ReasonPostgresNotReady}},
		},
		"parameters the server would log, with statement logging off: False, and the store stays Ready": {
			facts: storeFacts{schema: compliant, paramLog: postgres.ParameterLogging{Role: "lethe_manager", MaxLength: -1}},
			want: map[string]want{
				lethev1.MemoryStoreReady:              {"True", lethev1.ReasonAllReady},
				lethev1.MemoryStoreParametersUnlogged: {"False", lethev1.ReasonParametersLogged},
			},
		},
		"parameters logged on error only: False": {
			facts: storeFacts{schema: compliant, paramLog: postgres.ParameterLogging{Role: "lethe_manager", MaxLengthOnError: 64}},
			want:  map[string]want{lethev1.MemoryStoreParametersUnlogged: {"False", lethev1.ReasonParametersLogged}},
		},
		"values auto_explain logs: False": {
			facts: storeFacts{schema: compliant, paramLog: postgres.ParameterLogging{Role: "lethe_manager", ValuesLoggedBy: []string{"auto_explain.log_min_duration = 0"}}},
			want:  map[string]want{lethev1.MemoryStoreParametersUnlogged: {"False", lethev1.ReasonParametersLogged}},
		},
		"no parameter logged": {
			facts: storeFacts{schema: compliant, paramLog: postgres.ParameterLogging{Role: "lethe_manager", LoggingNow: []string{"log_statement = all"}}},
			want:  map[string]want{lethev1.MemoryStoreParametersUnlogged: {"True", lethev1.ReasonParameterLoggingOff}},
		},
		"a parameter logging check that failed is Unknown": {
			facts: storeFacts{schema: compliant, paramLogErr: errors.New("timeout")},
			want:  map[string]want{lethev1.MemoryStoreParametersUnlogged: {"Unknown", lethev1.ReasonParameterLoggingCheckFailed}},
		},
		"postgres down makes the parameter logging unknown": {
			facts: storeFacts{postgres: fail(lethev1.ReasonConnectionFailed, "primary: refused")},
			want:  map[string]want{lethev1.MemoryStoreParametersUnlogged: {"Unknown", lethev1.ReasonPostgresNotReady}},
		},
		"an erasure check that failed is Unknown": {
			facts: storeFacts{schema: compliant, erasuresErr: errors.New("timeout")},
			want: map[string]want{
				lethev1.MemoryStoreErasuresIntact: {"Unknown", lethev1.ReasonErasureCheckFailed},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := map[string]metav1.Condition{}
			for _, c := range storeConditions(tc.facts, 7) {
				if c.ObservedGeneration != 7 || c.Message == "" {
					t.Errorf("%s: generation %d, message %q", c.Type, c.ObservedGeneration, c.Message)
				}
				got[c.Type] = c
			}
			if len(got) != 9 {
				t.Fatalf("want 9 conditions, got %d", len(got))
			}
			for typ, w := range tc.want {
				if c := got[typ]; string(c.Status) != w.status || c.Reason != w.reason {
					t.Errorf("%s = %s/%s, want %s/%s", typ, c.Status, c.Reason, w.status, w.reason)
				}
			}
		})
	}
}

// ParametersUnlogged=False says what is logged now and gives the fix for
// where the setting comes from, with names quoted as identifiers.
func TestParametersLoggedMessageSaysWhatAndHowToFix(t *testing.T) {
	f := storeFacts{schema: &postgres.SchemaReport{}, paramLog: postgres.ParameterLogging{Role: `lethe "ops"`, Database: "memory",
		MaxLength: -1, MaxLengthSource: "user", LoggingNow: []string{"log_min_duration_statement = 0"}}}
	for _, tc := range []struct {
		name string
		edit func(*postgres.ParameterLogging)
		want []string
	}{
		{name: "a role setting", edit: func(*postgres.ParameterLogging) {}, want: []string{
			"log_parameter_max_length = -1 (user) logs every byte", "statements are logged now (log_min_duration_statement = 0)",
			`Fix: as a superuser, ALTER ROLE "lethe ""ops""" SET log_parameter_max_length = 0`}},
		{name: "a role-in-database setting", edit: func(p *postgres.ParameterLogging) { p.MaxLengthSource = "database user" },
			want: []string{`ALTER ROLE "lethe ""ops""" IN DATABASE "memory" SET log_parameter_max_length = 0`}},
		{name: "a DSN option", edit: func(p *postgres.ParameterLogging) { p.MaxLengthSource = "client" },
			want: []string{"remove log_parameter_max_length from the options of the store's DSN"}},
		{name: "a bounded length, nothing logged now", edit: func(p *postgres.ParameterLogging) { p.MaxLength, p.LoggingNow = 512, nil },
			want: []string{"up to 512 bytes", "no statement is logged now"}},
		{name: "auto_explain", edit: func(p *postgres.ParameterLogging) {
			p.MaxLength, p.ValuesLoggedBy = 0, []string{"auto_explain.log_min_duration = 0"}
		}, want: []string{"auto_explain.log_min_duration = 0 write statement values", `turn off auto_explain.log_min_duration = 0 for role "lethe ""ops"""`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := f
			tc.edit(&f.paramLog)
			c := paramCondition(f)
			if c.Status != metav1.ConditionFalse {
				t.Fatalf("status %s, want False", c.Status)
			}
			for _, w := range tc.want {
				if !strings.Contains(c.Message, w) {
					t.Errorf("message %q lacks %q", c.Message, w)
				}
			}
		})
	}
}

func paramCondition(f storeFacts) metav1.Condition {
	for _, c := range storeConditions(f, 1) {
		if c.Type == lethev1.MemoryStoreParametersUnlogged {
			return c
		}
	}
	return metav1.Condition{}
}

// The condition names the column, each detector and its count, and no
// value (the audit never holds one past counting).
func TestRedactionMessageNamesDetectorsAndCounts(t *testing.T) {
	f := storeFacts{redaction: []postgres.RedactedColumn{
		{Column: "memory.rounds.assistant_thinking", Exists: true, Trigger: true, Sampled: 200, Found: redact.Counts{"email": 2, "card": 1}},
		{Column: "memory.notes.body", Exists: true},
	}}
	c := redactionCondition(f, func(typ string, ok bool, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Reason: reason, Message: msg}
	})
	want := "no redaction trigger that holds (lethe.redact_column) on memory.notes.body; memory.rounds.assistant_thinking: 1 card, 2 email in 200 sampled values"
	if c.Reason != lethev1.ReasonRedactionTriggerMissing || c.Message != want {
		t.Fatalf("condition %s: %q, want %q", c.Reason, c.Message, want)
	}
}

// A compliant column says whether a sample was checked: no value sampled
// (an empty column, sampling off, a table not tied to the tenant) is not a
// clean sample.
func TestRedactedMessageSaysWhatWasSampled(t *testing.T) {
	reasoning := postgres.RedactedColumn{Column: "memory.rounds.assistant_thinking", Exists: true, Trigger: true}
	profiles := postgres.RedactedColumn{Column: "memory_derived.profiles.summary", Exists: true, Trigger: true,
		NotSampled: "not tied to the store's tenant by a session_id column"}
	sampled := reasoning
	sampled.Sampled = 200
	reasoning2 := reasoning
	reasoning2.Column = "memory.rounds.user_text"
	for _, tc := range []struct {
		cols []postgres.RedactedColumn
		want string
	}{
		{[]postgres.RedactedColumn{sampled}, "memory.rounds.assistant_thinking redacted at insert; no detectable value in the sample"},
		{[]postgres.RedactedColumn{reasoning}, "memory.rounds.assistant_thinking redacted at insert; no value sampled, so none checked"},
		{[]postgres.RedactedColumn{sampled, profiles}, "memory.rounds.assistant_thinking, memory_derived.profiles.summary redacted at insert; " +
			"no detectable value in the sample; not sampled: memory_derived.profiles.summary (not tied to the store's tenant by a session_id column)"},
		{[]postgres.RedactedColumn{sampled, reasoning2}, "memory.rounds.assistant_thinking, memory.rounds.user_text redacted at insert; " +
			"no detectable value in the sample; no value sampled in memory.rounds.user_text"},
	} {
		c := redactionCondition(storeFacts{redaction: tc.cols}, func(typ string, ok bool, reason, msg string) metav1.Condition {
			return metav1.Condition{Type: typ, Reason: reason, Message: msg}
		})
		if c.Reason != lethev1.ReasonRedacted || c.Message != tc.want {
			t.Errorf("condition %s: %q, want %q", c.Reason, c.Message, tc.want)
		}
	}
}

func TestViolationsMessageIsStableAndNamesEachTable(t *testing.T) {
	a := violationsMessage([]postgres.Violation{{Rule: "NoCascade", Table: "memory.b", Column: "session_id"}, {Rule: "MissingTable", Table: "memory.a"}})
	b := violationsMessage([]postgres.Violation{{Rule: "MissingTable", Table: "memory.a"}, {Rule: "NoCascade", Table: "memory.b", Column: "session_id"}})
	if a != b {
		t.Fatalf("message depends on order: %q vs %q", a, b)
	}
	if want := "2 schema violation(s): MissingTable memory.a; NoCascade memory.b.session_id"; a != want {
		t.Fatalf("got %q, want %q", a, want)
	}
}
