package controllers_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	pgxvec "github.com/pgvector/pgvector-go/pgx"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/fixture"
)

// The manager "crashes" at every step boundary and inside the deletion
// transaction (decorated ports fail after their work committed, before it
// started, or roll the transaction back at its commit, and the pass loses
// its status write), at random, across 100 requests. Every
// request still completes, nothing outside the requests is deleted, and each
// step's receipt exists exactly once (target R1).
func TestCrashesAtEveryBoundaryLeaveOneReceiptPerStep(t *testing.T) {
	const runs = 100
	ctx := context.Background()
	ns := newNamespace(t, "crash")
	dsn := migratedDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if err := pgxvec.RegisterTypes(ctx, conn); err != nil {
		t.Fatal(err)
	}
	id := func(run, k int) string { return fmt.Sprintf("%08d-0000-4000-8000-%012d", run, k) }
	var kept []string
	for run := 0; run < runs; run++ {
		for k := 0; k < 3; k++ {
			if err := fixture.Seed(ctx, conn, fixture.Session{ID: id(run, k), Tenant: "t1", Rounds: 1, Text: "x", Seed: run*3 + k}); err != nil {
				t.Fatal(err)
			}
		}
		kept = append(kept, id(run, 2))
	}
	createSecret(t, ns, "pg", map[string]string{"dsn": dsn})
	store := newStore(ns, func(s *lethev1.MemoryStore) { s.Spec.TenantID = "t1" })
	if err := k8s.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, store, lethev1.MemoryStoreReady, metav1.ConditionTrue, lethev1.ReasonAllReady)

	droppedBefore := lostStatusWrites.dropped.Load()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 11))
	crashes := map[string]int{}
	restore := setCrashHook(func(namespace, point string) bool {
		if namespace != ns {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if rng.Float64() < 0.35 {
			crashes[point]++
			return true
		}
		return false
	})
	defer restore()

	reqs := make([]*lethev1.ErasureRequest, runs)
	for run := range reqs {
		reqs[run] = &lethev1.ErasureRequest{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("crash-%03d", run), Namespace: ns},
			Spec: lethev1.ErasureRequestSpec{
				StoreRef: lethev1.StoreReference{Name: store.Name}, Immediate: true, Reason: "crash test",
				SessionIDs: []lethev1.SessionID{lethev1.SessionID(id(run, 0)), lethev1.SessionID(id(run, 1))},
			},
		}
		if err := k8s.Create(ctx, reqs[run]); err != nil {
			t.Fatal(err)
		}
	}
	// A bound on liveness, not a speed figure: the suite's manager works one
	// request at a time, each crash costs a backoff, and the suite's other
	// packages share the two cores (about 100 s alone, over 3 min in CI).
	eventually(t, 10*time.Minute, func() error {
		for _, er := range reqs {
			got := &lethev1.ErasureRequest{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(er), got); err != nil {
				return err
			}
			if got.Status.Phase != lethev1.PhaseBackupsRotated {
				return fmt.Errorf("%s at %q", er.Name, got.Status.Phase)
			}
		}
		return nil
	})
	restore()

	mu.Lock()
	total := 0
	for _, n := range crashes {
		total += n
	}
	t.Logf("%d requests, %d simulated crashes: %v", runs, total, crashes)
	for _, point := range []string{"after-tombstone-commit", "after-claim", "inside-delete-transaction", "after-delete-commit", "before-status-write"} {
		if crashes[point] == 0 {
			t.Errorf("no crash was injected at %s", point)
		}
	}
	if lostStatusWrites.dropped.Load() == droppedBefore {
		t.Error("no crashed pass lost its status write: the crashes did not model a killed manager")
	}
	mu.Unlock()

	var left, keptLeft int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT (id = ANY($1::uuid[]))), count(*) FILTER (WHERE id = ANY($1::uuid[])) FROM memory.sessions`, kept).Scan(&left, &keptLeft); err != nil {
		t.Fatal(err)
	}
	if left != 0 || keptLeft != runs {
		t.Errorf("sessions: %d requested left (want 0), %d kept (want %d)", left, keptLeft, runs)
	}
	rows, err := conn.Query(ctx, `SELECT request_uid, step, count(*) FROM lethe.erasure_receipts GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	perStep := map[string]int{}
	var uid, step string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&uid, &step, &n}, func() error {
		if n != 1 {
			t.Errorf("request %s has %d %s receipts", uid, n, step)
		}
		perStep[step]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if perStep["Tombstoned"] != runs || perStep["Deleted"] != runs {
		t.Errorf("receipts per step: %v, want %d Tombstoned and %d Deleted", perStep, runs, runs)
	}
}
