package evidence

import (
	"encoding/json"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/version"
)

// ReceiptPredicate is the predicate of a receipt's in-toto statement
// (PredicateType): what an auditor needs without the request object, and
// the digests that tie it to the object's plan and step evidence. Counts,
// names of tables and Backups, digests and times only.
type ReceiptPredicate struct {
	Format         string             `json:"format"`
	Request        RequestIdentity    `json:"request"`
	Store          string             `json:"store"`
	RequestedAt    string             `json:"requestedAt"`
	Deadline       string             `json:"deadline"`
	IssuedAt       string             `json:"issuedAt"`
	Sessions       int                `json:"sessions"`
	Phase          string             `json:"phase"`
	HistoryHead    string             `json:"historyHead"`
	HistoryLength  int                `json:"historyLength"`
	EvidenceDigest string             `json:"evidenceDigest"`
	PlanDigest     string             `json:"planDigest"`
	StepDigests    map[string]string  `json:"stepDigests"`
	Milestones     []MilestoneSummary `json:"milestones"`
	Steps          []StepSummary      `json:"steps"`
	Backups        BackupSummary      `json:"backups"`
	Lethe          map[string]string  `json:"lethe"`
}

// RequestIdentity names the request; an anonymous receipt has the UID only.
type RequestIdentity struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	UID       string `json:"uid"`
}

// MilestoneSummary is one history entry's phase, event and time (the
// database's clock where the step ran there).
type MilestoneSummary struct {
	Phase string `json:"phase"`
	Event string `json:"event,omitempty"`
	Time  string `json:"time"`
}

// StepSummary is one step's times, counts and verification results.
type StepSummary struct {
	Step         string                 `json:"step"`
	StartedAt    string                 `json:"startedAt,omitempty"`
	CompletedAt  string                 `json:"completedAt,omitempty"`
	VacuumedAt   string                 `json:"vacuumedAt,omitempty"`
	Counts       map[string]int64       `json:"counts"`
	Verification []lethev1.Verification `json:"verification"`
}

// BackupSummary says how many Backups may have held the data, how many
// Lethe saw removed, and the latest expiration it left.
type BackupSummary struct {
	Recorded         int    `json:"recorded"`
	Gone             int    `json:"gone"`
	LatestExpiration string `json:"latestExpiration,omitempty"`
}

func rfc3339(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// PredicateOf is the predicate of a receipt covering the first length
// entries of er's history, er's plan and evidence as they stand.
func PredicateOf(er *lethev1.ErasureRequest, length int, issuedAt time.Time) (ReceiptPredicate, error) {
	st := &er.Status
	requested := er.CreationTimestamp.Time
	if er.Spec.RequestedAt != nil {
		requested = er.Spec.RequestedAt.Time
	}
	p := ReceiptPredicate{
		Format: Format, Request: RequestIdentity{Namespace: er.Namespace, Name: er.Name, UID: string(er.UID)},
		Store: er.Spec.StoreRef.Name, RequestedAt: rfc3339(&requested), IssuedAt: rfc3339(&issuedAt), Sessions: len(er.Spec.SessionIDs),
		HistoryLength: length, StepDigests: map[string]string{},
		Milestones: []MilestoneSummary{}, Steps: []StepSummary{},
		Lethe: map[string]string{"version": version.Get().Version, "gitCommit": version.Get().GitCommit},
	}
	if er.Name == "" {
		p.Request = RequestIdentity{UID: string(er.UID)}
	}
	if st.Deadline != nil {
		p.Deadline = rfc3339(&st.Deadline.Time)
	}
	if length > 0 && length <= len(st.History) {
		// The phase is the covered entry's: status.phase is derived later.
		e := st.History[length-1]
		p.HistoryHead, p.EvidenceDigest, p.Phase = e.Digest, e.EvidenceDigest, string(e.Phase)
	}
	for _, h := range st.History[:min(length, len(st.History))] {
		p.Milestones = append(p.Milestones, MilestoneSummary{Phase: string(h.Phase), Event: h.Event, Time: rfc3339(&h.Time.Time)})
	}
	var err error
	if p.PlanDigest, err = CanonicalDigest(st.Plan); err != nil {
		return p, err
	}
	if st.Evidence != nil {
		for _, s := range st.Evidence.Steps {
			if p.StepDigests[s.Step], err = CanonicalDigest(s); err != nil {
				return p, err
			}
			p.Steps = append(p.Steps, summarize(s))
			addBackups(&p.Backups, s.Backups)
		}
	}
	return p, nil
}

func summarize(s lethev1.StepEvidence) StepSummary {
	sum := StepSummary{Step: s.Step, Counts: map[string]int64{}, Verification: s.Verification}
	if sum.Verification == nil {
		sum.Verification = []lethev1.Verification{}
	}
	for _, c := range s.Counts {
		sum.Counts[c.Table] = c.Rows
	}
	if s.StartedAt != nil {
		sum.StartedAt = rfc3339(&s.StartedAt.Time)
	}
	if s.CompletedAt != nil {
		sum.CompletedAt = rfc3339(&s.CompletedAt.Time)
	}
	if s.VacuumedAt != nil {
		sum.VacuumedAt = rfc3339(&s.VacuumedAt.Time)
	}
	return sum
}

func addBackups(sum *BackupSummary, backups []lethev1.BackupEvidence) {
	for _, b := range backups {
		sum.Recorded++
		if b.GoneAt != nil {
			sum.Gone++
		}
		if b.Expiration != nil {
			if e := rfc3339(&b.Expiration.Time); e > sum.LatestExpiration {
				sum.LatestExpiration = e
			}
		}
	}
}

// predicateOf is PredicateOf as the protobuf Struct a statement carries.
func predicateOf(er *lethev1.ErasureRequest, length int, issuedAt time.Time) (*structpb.Struct, error) {
	p, err := PredicateOf(er, length, issuedAt)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	s := &structpb.Struct{}
	return s, protojson.Unmarshal(raw, s)
}
