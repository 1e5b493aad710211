package connector

import (
	"sync"
	"time"
)

// secretValues holds Secret values read successfully, each for the
// Connector's SecretTTL: every pass of every request reads its store's DSN,
// and at thousands of requests those reads were a third of the manager's
// API calls. Only the value of the key read is held (never the rest of the
// Secret), and a failed read is never held: a Secret created or fixed by a
// human is seen on the next pass. A rotated value is picked up within the
// TTL; a pool built from the old DSN keeps working until then, as it does
// between a rotation and any pass.
type secretValues struct {
	mu      sync.Mutex
	entries map[secretKey]secretValue
}

type secretKey struct{ namespace, name, key string }

type secretValue struct {
	value string
	until time.Time
}

// get returns the value held for k, if it is still fresh at now.
func (s *secretValues) get(k secretKey, now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.entries[k]
	if !ok || !now.Before(v.until) {
		return "", false
	}
	return v.value, true
}

// put holds value for k until now+ttl, and drops the entries that expired
// (those of Secrets no pass reads any more).
func (s *secretValues) put(k secretKey, value string, now time.Time, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.entries == nil {
		s.entries = map[secretKey]secretValue{}
	}
	for old, v := range s.entries {
		if !now.Before(v.until) {
			delete(s.entries, old)
		}
	}
	s.entries[k] = secretValue{value: value, until: now.Add(ttl)}
}
