// Package report renders the certificate of erasure: a one-page,
// self-contained HTML document (inline CSS, no scripts, no external resources)
// that tells an auditor what an ErasureRequest asked for, what Lethe erased,
// checked and rotated, and whether the evidence behind it verified.
//
// The package does no verification of its own and reads nothing but the
// Certificate it is given: the caller fills it from an evidence bundle it has
// verified (see Verification), and the page shows only what the model holds.
package report

import (
	"bytes"
	_ "embed" // the page's template
	"fmt"
	"html/template"
	"io"
	"strconv"
	"time"
)

// Certificate is the view model of one certificate of erasure.
type Certificate struct {
	Request    RequestInfo
	Milestones []Milestone
	// Plan is the rows per table the erasure planned to remove.
	Plan    []Count
	Steps   []Step
	Backups []Backup
	// Verification is the outcome of the caller's own verification of the
	// bundle this certificate is filled from. See the type.
	Verification Verification
	// Keys is the key set the bundle was verified against.
	Keys    []Key
	Receipt *ReceiptInfo
	Log     *LogInfo
	// EvidenceFormat is the version of the bundle's format.
	EvidenceFormat string
	LetheVersion   string
	GeneratedAt    time.Time
}

// RequestInfo is what was asked.
type RequestInfo struct {
	Namespace, Name, UID string
	// Store is the MemoryStore the sessions live in.
	Store                                     string
	Sessions, SessionsFound, SessionsNotFound int
	RequestedAt, Deadline                     time.Time
	// Immediate: the grace period was skipped.
	Immediate bool
	// Phase is the last milestone the request reached.
	Phase string
}

// Milestone is one entry of the request's history.
type Milestone struct {
	Phase, Event string
	Time         time.Time
	// KeyID is the key that signed the entry; empty when it is unsigned.
	KeyID string
}

// Count is a number of rows (or nodes, relationships...) of one table (or
// label, kind...).
type Count struct {
	Table string
	Rows  int64
}

// Step is what one step of the erasure did.
type Step struct {
	Name                               string
	StartedAt, CompletedAt, VacuumedAt *time.Time
	Counts                             []Count
	Checks                             []Check
	Note                               string
}

// Check is one thing looked for after a step; Found 0 means verified absent.
type Check struct {
	Check string
	Found int64
}

// Backup is one backup that may have held the erased data.
type Backup struct {
	Name                                              string
	StartedAt, OriginalExpiration, Expiration, GoneAt *time.Time
	DeleteBackupRequest                               string
}

// Verification is the outcome of verifying the evidence bundle.
//
// The caller must compute it by verifying the bundle (the history chain, the
// receipt's signature against Keys, the log inclusion) right before rendering.
// It must never be copied from the bundle, a stored status or an earlier
// certificate: the banner is only as true as this value.
type Verification struct {
	OK bool
	// Checks are the checks that passed, each a sentence.
	Checks []string
	// Failure says what did not verify; empty when OK.
	Failure string
}

// Key is one key of the key set.
type Key struct {
	ID string
	// Validity says when the key was in force, e.g.
	// "from 2026-11-01T00:00:00Z, still current".
	Validity string
}

// ReceiptInfo is the signed receipt over the history.
type ReceiptInfo struct {
	Digest, KeyID string
	IssuedAt      time.Time
}

// LogInfo is the receipt's position in the transparency log.
type LogInfo struct {
	Origin      string
	Index, Size int64
}

//go:embed certificate.html.tmpl
var pageSource string

var page = template.Must(template.New("certificate").Funcs(template.FuncMap{
	"utc":      utc,
	"utcp":     utcPtr,
	"keyShort": keyShort,
	"found":    found,
}).Parse(pageSource))

// RenderHTML writes the certificate as one self-contained HTML page. Nothing
// is written when the template fails.
func RenderHTML(w io.Writer, c Certificate) error {
	var buf bytes.Buffer
	if err := page.Execute(&buf, c); err != nil {
		return fmt.Errorf("render certificate: %w", err)
	}
	_, err := buf.WriteTo(w)
	return err
}

// notRecorded stands for a time the model does not hold.
const notRecorded = "—"

// shortKeyLen is how many characters of a key ID the timeline shows.
const shortKeyLen = 12

// utc formats t in UTC, RFC 3339.
func utc(t time.Time) string {
	if t.IsZero() {
		return notRecorded
	}
	return t.UTC().Format(time.RFC3339)
}

func utcPtr(t *time.Time) string {
	if t == nil {
		return notRecorded
	}
	return utc(*t)
}

// keyShort is the start of a key ID, or "unsigned" for none.
func keyShort(id string) string {
	if id == "" {
		return "unsigned"
	}
	if len(id) > shortKeyLen {
		return id[:shortKeyLen]
	}
	return id
}

// found is a check's result: "absent" for 0.
func found(n int64) string {
	if n == 0 {
		return "absent"
	}
	return "found " + strconv.FormatInt(n, 10)
}
