package graph

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Prunes of one graph run one at a time; another graph's do not wait; a
// prune waiting for the lock gives up when its context ends.
func TestPruneLockIsPerGraph(t *testing.T) {
	ctx := context.Background()
	g := &Graph{name: "memory", c: &Client{host: "falkor-a:6379"}}
	same := &Graph{name: "memory", c: &Client{host: "falkor-a:6379"}} // another client of the same server
	other := &Graph{name: "memory", c: &Client{host: "falkor-b:6379"}}
	unlock, err := g.lockPrune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := same.lockPrune(waiting); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second prune of the same graph took the lock while it was held (%v)", err)
	}
	unlockOther, err := other.lockPrune(ctx)
	if err != nil {
		t.Fatalf("another server's graph waited: %v", err)
	}
	unlockOther()
	unlock()
	again, err := same.lockPrune(ctx)
	if err != nil {
		t.Fatalf("the lock was not released: %v", err)
	}
	again()
}
