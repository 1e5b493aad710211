// Package storerecord keeps, per MemoryStore and in the API server, a
// compact record of what its requests erased, so that a restore of the
// memory database stays detectable, and erasable again, after the request
// objects are gone (a GitOps prune, a namespace clean-up). The ledger in
// the database is only the working copy: a restore takes it back.
//
// The record holds, per request UID, when the deletion finished, keyed
// hashes of the erased session IDs (HMAC-SHA256 with the records' key, a
// Secret in the manager's namespace, truncated to 128 bits) and the ledger's own keyed hashes of
// their source identifiers. Never content, never a request's name. It lives
// in ConfigMaps named <store>-erasure-record-<n> with no owner, so that it
// outlives a MemoryStore deleted and re-created by the same name.
package storerecord

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Entry is what one request erased.
type Entry struct {
	ErasedAt time.Time `json:"erasedAt"`
	// Sessions are keyed hashes (Hash) of the erased session IDs, sorted.
	Sessions []string `json:"sessions"`
	// Sources are the ledger's keyed hashes of the erased sessions' source
	// identifiers (lethe.source_hash), sorted.
	Sources []string `json:"sources,omitempty"`
	// LedgerKey is the fingerprint (lethe.erasure_key_id) of the erasure
	// key the ledger's source rows say Sources are HMACs under; the rows
	// put back from the record say it again, so that the audit finds them
	// under another key if the database's changed. Empty when unknown.
	LedgerKey string `json:"ledgerKey,omitempty"`
}

// Record is a store's record: the key and the entries by request UID.
type Record struct {
	Key     []byte
	Entries map[string]Entry
}

// Hash is the keyed hash of a session ID kept in the record.
func Hash(key []byte, sessionID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(sessionID))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// KeyID is the fingerprint of the records' key kept on each part of a
// record (AnnotationKeyID): it does not reveal the key.
func KeyID(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("lethe.dev/erasure-record-key-id"))
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)[:16])
}

// NewEntry hashes the session IDs with key; ledgerKey is the fingerprint
// of the erasure key sources are HMACs under.
func NewEntry(key []byte, erasedAt time.Time, sessionIDs, sources []string, ledgerKey string) Entry {
	e := Entry{ErasedAt: erasedAt.UTC().Truncate(time.Second), Sources: slices.Sorted(slices.Values(sources)), LedgerKey: ledgerKey}
	for _, id := range sessionIDs {
		e.Sessions = append(e.Sessions, Hash(key, id))
	}
	slices.Sort(e.Sessions)
	return e
}

// Matcher reports which session IDs an entry names.
func (r Record) Matcher(e Entry) func(sessionID string) bool {
	return func(id string) bool {
		_, found := slices.BinarySearch(e.Sessions, Hash(r.Key, id))
		return found
	}
}

func encode(e Entry) (string, error) {
	b, err := json.Marshal(e)
	return string(b), err
}

func decode(uid, s string) (Entry, error) {
	var e Entry
	if err := json.Unmarshal([]byte(s), &e); err != nil {
		return e, fmt.Errorf("erasure record entry %s: %w", uid, err)
	}
	if !slices.IsSorted(e.Sessions) {
		slices.Sort(e.Sessions)
	}
	return e, nil
}
