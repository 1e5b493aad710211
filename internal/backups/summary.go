package backups

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"slices"
	"strings"
	"time"
)

// AnnotationErasures holds, on a Backup, one bounded summary of the
// requests whose erased data the Backup may hold (a Summary, as JSON). One
// key whatever the number of requests: Kubernetes caps an object's
// annotations at 256 KiB in all, and one key per request reached it after a
// few thousand requests, after which every rotation of the Backup failed.
const AnnotationErasures = "erasure.lethe.dev/erasures"

// legacyErasedPrefix + request UID is the per-request annotation of earlier
// releases; a rotation folds those it finds into the summary and removes them.
const legacyErasedPrefix = "erasure.lethe.dev/erased-"

// recentKept bounds Summary.Recent.
const recentKept = 32

// Summary is what AnnotationErasures holds. It names no request: Backups live
// in Velero's namespace, and a request's name (forget-john-smith) must not
// leave the request's own.
type Summary struct {
	// Count is how many requests marked the Backup.
	Count int `json:"count"`
	// EarliestDeadline is the earliest of their deadlines (RFC 3339): the
	// latest moment the Backup may still exist.
	EarliestDeadline string `json:"earliestDeadline,omitempty"`
	// RequestsDigest is the sum, modulo 2^256, of sha256(UID) over the
	// requests counted (hex): order-free, so an auditor holding the request
	// UIDs recomputes it (RequestsDigest below).
	RequestsDigest string `json:"requestsDigest"`
	// Recent holds the first 12 hex digits of sha256(UID) of the latest
	// requests counted, at most 32: a request that marks the Backup again
	// (a retry after a crash between this write and its own status write)
	// is not counted twice. A retry after 32 other requests marked the same
	// Backup would be.
	Recent []string `json:"recent,omitempty"`
}

// RequestsDigest is Summary.RequestsDigest for the given request UIDs.
func RequestsDigest(uids []string) string {
	var s Summary
	for _, uid := range uids {
		s.addDigest(uid)
	}
	return s.RequestsDigest
}

var modulus = new(big.Int).Lsh(big.NewInt(1), 256)

func (s *Summary) addDigest(uid string) {
	sum := new(big.Int)
	if s.RequestsDigest != "" {
		if b, err := hex.DecodeString(s.RequestsDigest); err == nil {
			sum.SetBytes(b)
		}
	}
	h := sha256.Sum256([]byte(uid))
	sum.Add(sum, new(big.Int).SetBytes(h[:])).Mod(sum, modulus)
	out := make([]byte, 32)
	s.RequestsDigest = hex.EncodeToString(sum.FillBytes(out))
}

func recentKey(uid string) string {
	h := sha256.Sum256([]byte(uid))
	return hex.EncodeToString(h[:6])
}

// add counts the request uid with its deadline; it reports whether the
// summary changed (false for a request it counted recently).
func (s *Summary) add(uid string, deadline time.Time) bool {
	key := recentKey(uid)
	if slices.Contains(s.Recent, key) {
		return s.lowerDeadline(deadline)
	}
	s.Count++
	s.addDigest(uid)
	s.Recent = append(s.Recent, key)
	if len(s.Recent) > recentKept {
		s.Recent = s.Recent[len(s.Recent)-recentKept:]
	}
	s.lowerDeadline(deadline)
	return true
}

func (s *Summary) lowerDeadline(deadline time.Time) bool {
	if deadline.IsZero() {
		return false
	}
	if cur, err := time.Parse(time.RFC3339, s.EarliestDeadline); err == nil && !deadline.Before(cur) {
		return false
	}
	s.EarliestDeadline = deadline.UTC().Format(time.RFC3339)
	return true
}

// ReadSummary reads a Backup's summary from its annotations. A value that
// does not parse (edited by hand) starts a new summary: the requests' own
// evidence still lists the Backup.
func ReadSummary(ann map[string]string) Summary {
	var s Summary
	if v, ok := ann[AnnotationErasures]; ok {
		if err := json.Unmarshal([]byte(v), &s); err != nil {
			return Summary{}
		}
	}
	return s
}

// markErased counts the request in the annotations' summary (unless
// counted is set: the request's evidence lists the Backup already), folding
// in (and removing) the per-request annotations of earlier releases; it
// reports whether the annotations changed.
func markErased(ann map[string]string, uid string, deadline time.Time, counted bool) bool {
	s := ReadSummary(ann)
	changed := false
	keys := make([]string, 0)
	for k := range ann {
		if strings.HasPrefix(k, legacyErasedPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		// Their value was the deadline (or, earlier still, the request's name).
		d, _ := time.Parse(time.RFC3339, ann[k])
		s.add(strings.TrimPrefix(k, legacyErasedPrefix), d)
		delete(ann, k)
		changed = true
	}
	if !counted && s.add(uid, deadline) {
		changed = true
	}
	if !changed {
		return false
	}
	b, err := json.Marshal(s)
	if err != nil {
		return false
	}
	ann[AnnotationErasures] = string(b)
	return true
}
