package erasure

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"time"
)

// ReplicaWaits remembers, per request and step, the WAL position the step
// waits for every replica to replay past: the first one read after the
// step last changed something. A pass that changed nothing waits for that
// position, not the primary's position then: on a busy primary that one
// moves ahead of any replica with a lag, and a step that read it anew on
// every pass would wait forever. It is memory only: after a restart the
// position is read anew, later than needed, which is safe. A nil
// *ReplicaWaits remembers nothing.
type ReplicaWaits struct{ m sync.Map }

type replicaWait struct{ lsn, of string }

// caughtUp asks whether every replica replayed past the position the step
// waits for. lsn is the position read in this pass, at or after its
// commits; of names what the step changed: "" when this pass changed
// nothing (the remembered position holds), else anything that differs
// when the change differs (the remembered position is replaced). The
// position is forgotten once every replica replayed it.
func (w *ReplicaWaits) caughtUp(ctx context.Context, s *Scope, step, lsn, of string) (bool, error) {
	if w == nil {
		return s.Replicas.CaughtUp(ctx, lsn)
	}
	key := s.uid() + "/" + step
	want := replicaWait{lsn: lsn, of: of}
	if v, ok := w.m.Load(key); ok && (of == "" || v.(replicaWait).of == of) {
		want = v.(replicaWait)
	} else {
		w.m.Store(key, want)
	}
	ok, err := s.Replicas.CaughtUp(ctx, want.lsn)
	if err == nil && ok {
		w.m.CompareAndDelete(key, want)
	}
	return ok, err
}

// remembers reports whether a position is remembered for the request's
// step that covers of.
func (w *ReplicaWaits) remembers(uid, step, of string) bool {
	if w == nil {
		return false
	}
	v, ok := w.m.Load(uid + "/" + step)
	return ok && v.(replicaWait).of == of
}

// forget drops what is remembered for a request's steps.
func (w *ReplicaWaits) forget(uid string, steps ...string) {
	if w == nil {
		return
	}
	for _, step := range steps {
		w.m.Delete(uid + "/" + step)
	}
}

// tombstoneOf names what a tombstone covers, for caughtUp's of: the found
// sessions and their latest tombstone. Any tombstone that hid one of them
// later (a repeat after a partial restore, another manager, a tombstone
// again after a restore) moves the latter; a session found for the first
// time moves the former even when its tombstone is older than the latest
// (tombstoned_at is its transaction's start, which can precede the
// remembered position while its commit follows it). A repeat that found
// and hid nothing new leaves both.
func tombstoneOf(plan Plan) string {
	found := slices.Sorted(slices.Values(plan.Found))
	sum := sha256.Sum256([]byte(strings.Join(found, "\x00")))
	return "hidden " + plan.HiddenAt.UTC().Format(time.RFC3339Nano) + " found " + hex.EncodeToString(sum[:8])
}
