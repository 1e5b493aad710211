package controllers

import (
	"errors"
	"testing"
	"time"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// TestAuditRetry: a store whose erasure check failed, or whose audit found
// a restore, is audited again within the retry, not at the recheck (5 min by
// default): the sessions of a deleted request that a restore brought back
// wait for that audit to be erased again.
func TestAuditRetry(t *testing.T) {
	const recheck, retry = 5 * time.Minute, 30 * time.Second
	cases := map[string]struct {
		facts   storeFacts
		requeue time.Duration
		want    time.Duration
	}{
		"Intact":            {facts: storeFacts{}, requeue: recheck, want: recheck},
		"CheckFailed":       {facts: storeFacts{erasuresErr: errors.New("timeout")}, requeue: recheck, want: retry},
		"RestoreFound":      {facts: storeFacts{restores: []erasure.RestoreFinding{{UID: "u", SessionsBack: 1}}}, requeue: recheck, want: retry},
		"SweepDueSooner":    {facts: storeFacts{restores: []erasure.RestoreFinding{{UID: "u", LedgerRowsMissing: 1}}}, requeue: 5 * time.Second, want: 5 * time.Second},
		"IntactSweepSooner": {facts: storeFacts{}, requeue: 5 * time.Second, want: 5 * time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := auditRetry(tc.facts, tc.requeue, retry); got != tc.want {
				t.Errorf("next audit in %s, want %s", got, tc.want)
			}
		})
	}
}
