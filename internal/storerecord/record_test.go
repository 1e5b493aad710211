package storerecord_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/lethe-dev/lethe/internal/storerecord"
)

const id1, id2, other = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"

// The record names sessions by keyed hash only: the same ID under another
// key does not match, and the entry's text holds no ID.
func TestEntryMatchesItsSessionsOnlyUnderItsKey(t *testing.T) {
	key, otherKey := []byte(strings.Repeat("k", 32)), []byte(strings.Repeat("x", 32))
	e := storerecord.NewEntry(key, time.Unix(1e9, 0), []string{id2, id1}, []string{"b", "a"}, "hmac-sha256:k1")
	match := storerecord.Record{Key: key}.Matcher(e)
	if !match(id1) || !match(id2) || match(other) {
		t.Errorf("matcher: %v %v %v, want true true false", match(id1), match(id2), match(other))
	}
	if (storerecord.Record{Key: otherKey}).Matcher(e)(id1) {
		t.Error("a session matched under another key")
	}
	if s := fmt.Sprint(e); strings.Contains(s, id1) || strings.Contains(s, id2) {
		t.Errorf("entry %s names a session in the clear", s)
	}
	if e.Sources[0] != "a" {
		t.Errorf("sources %v not sorted", e.Sources)
	}
	if e.LedgerKey != "hmac-sha256:k1" {
		t.Errorf("ledger key %q, want the one given", e.LedgerKey)
	}
}

// Entries go to the last ConfigMap while it has room, then to a new one; a
// request is recorded once; Load reads every part back; the key is created
// once and reused.
func TestKeeperShardsAndReadsBack(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	k := &storerecord.Keeper{Client: c, Reader: c, ShardBytes: 400, KeySecret: types.NamespacedName{Namespace: "lethe-system", Name: "record-key"}}
	for i := range 5 {
		uid := fmt.Sprintf("uid-%d", i)
		if err := k.Add(ctx, "ns", "memory", uid, func(key []byte) storerecord.Entry {
			return storerecord.NewEntry(key, time.Unix(1e9, 0), []string{id1}, nil, "")
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Add(ctx, "ns", "memory", "uid-0", func([]byte) storerecord.Entry {
		t.Error("a recorded request was recorded again")
		return storerecord.Entry{}
	}); err != nil {
		t.Fatal(err)
	}
	cms := &corev1.ConfigMapList{}
	if err := c.List(ctx, cms, client.MatchingLabels{storerecord.LabelStore: "memory"}); err != nil {
		t.Fatal(err)
	}
	if len(cms.Items) < 2 {
		t.Errorf("%d ConfigMap(s), want the record split over several", len(cms.Items))
	}
	rec, err := k.Load(ctx, "ns", "memory")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Entries) != 5 || len(rec.Key) != 32 {
		t.Fatalf("loaded %d entries with a %d-byte key, want 5 and 32", len(rec.Entries), len(rec.Key))
	}
	if !rec.Matcher(rec.Entries["uid-3"])(id1) {
		t.Error("the loaded key does not match what was recorded with the created one")
	}
}

// A record's key is put back, never replaced: with the key Secret gone,
// Load and Add refuse (and make no new key) while any record exists in the
// cluster; a key Secret holding another key is refused by the parts that
// say theirs; a part written before the fingerprint was kept gets it on
// its next write.
func TestALostOrReplacedRecordKeyIsRefused(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	secret := types.NamespacedName{Namespace: "lethe-system", Name: "record-key"}
	k := &storerecord.Keeper{Client: c, Reader: c, KeySecret: secret}
	add := func(ns, uid string) error {
		return k.Add(ctx, ns, "memory", uid, func(key []byte) storerecord.Entry {
			return storerecord.NewEntry(key, time.Unix(1e9, 0), []string{id1}, nil, "")
		})
	}
	if err := k.Writable(ctx, "ns", "memory"); err != nil {
		t.Fatalf("writable before any record or key: %v", err)
	}
	if err := add("ns", "uid-1"); err != nil {
		t.Fatal(err)
	}
	if err := k.Writable(ctx, "ns", "memory"); err != nil {
		t.Fatalf("writable with its key: %v", err)
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "memory-erasure-record-0"}, cm); err != nil {
		t.Fatal(err)
	}
	key := &corev1.Secret{}
	if err := c.Get(ctx, secret, key); err != nil {
		t.Fatal(err)
	}
	if got, want := cm.Annotations[storerecord.AnnotationKeyID], storerecord.KeyID(key.Data["key"]); got != want || got == "" {
		t.Fatalf("the part says key %q, want %q", got, want)
	}

	if err := c.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Load(ctx, "ns", "memory"); err == nil || !strings.Contains(err.Error(), "key Secret lethe-system/record-key is gone") {
		t.Errorf("load with the key gone: %v, want refused", err)
	}
	// Another store's record is refused too: its namespace holds no record yet,
	// but the cluster does.
	if err := add("other", "uid-2"); err == nil || !strings.Contains(err.Error(), "records exist") {
		t.Errorf("add with the key gone: %v, want refused", err)
	}
	if err := c.Get(ctx, secret, &corev1.Secret{}); err == nil {
		t.Error("a new key was made while records exist")
	}
	if err := k.Writable(ctx, "other", "memory"); err == nil || !strings.Contains(err.Error(), "records exist") {
		t.Errorf("writable with the key gone: %v, want refused", err)
	}

	replaced := key.DeepCopy()
	replaced.ResourceVersion = ""
	replaced.Data = map[string][]byte{"key": []byte(strings.Repeat("z", 32))}
	if err := c.Create(ctx, replaced); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Load(ctx, "ns", "memory"); err == nil || !strings.Contains(err.Error(), "was written under record key") {
		t.Errorf("load under a replaced key: %v, want refused", err)
	}
	if err := add("ns", "uid-3"); err == nil || !strings.Contains(err.Error(), "was written under record key") {
		t.Errorf("add under a replaced key: %v, want refused", err)
	}
	if err := k.Writable(ctx, "ns", "memory"); err == nil || !strings.Contains(err.Error(), "was written under record key") {
		t.Errorf("writable under a replaced key: %v, want refused", err)
	}

	// A part without the fingerprint (written before it was kept) is
	// read, and says it once written again.
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "memory-erasure-record-0"}, cm); err != nil {
		t.Fatal(err)
	}
	delete(cm.Annotations, storerecord.AnnotationKeyID)
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Load(ctx, "ns", "memory"); err != nil {
		t.Errorf("load of a part without a fingerprint: %v", err)
	}
	if err := add("ns", "uid-4"); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "memory-erasure-record-0"}, cm); err != nil {
		t.Fatal(err)
	}
	if got := cm.Annotations[storerecord.AnnotationKeyID]; got != storerecord.KeyID([]byte(strings.Repeat("z", 32))) {
		t.Errorf("the part written again says key %q", got)
	}
}

// Many entries at once (the audit writing back what a lost record held)
// take one write per part they change, parts created in order, and leave
// the entries already recorded as they are.
func TestAddAllWritesEachPartOnce(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	base := fake.NewClientBuilder().WithScheme(scheme).Build()
	var writes []string
	c := interceptor.NewClient(base, interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			writes = append(writes, "create "+obj.GetName())
			return cl.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			writes = append(writes, "update "+obj.GetName())
			return cl.Update(ctx, obj, opts...)
		},
	})
	k := &storerecord.Keeper{Client: c, Reader: c, ShardBytes: 400, KeySecret: types.NamespacedName{Namespace: "lethe-system", Name: "record-key"}}
	entry := func(key []byte) storerecord.Entry {
		return storerecord.NewEntry(key, time.Unix(1e9, 0), []string{id1}, nil, "")
	}
	if err := k.Add(ctx, "ns", "memory", "uid-00", entry); err != nil {
		t.Fatal(err)
	}
	writes = nil
	all := map[string]func([]byte) storerecord.Entry{"uid-00": func([]byte) storerecord.Entry {
		t.Error("a recorded request was recorded again")
		return storerecord.Entry{}
	}}
	for i := 1; i < 12; i++ {
		all[fmt.Sprintf("uid-%02d", i)] = entry
	}
	if err := k.AddAll(ctx, "ns", "memory", all); err != nil {
		t.Fatal(err)
	}
	rec, err := k.Load(ctx, "ns", "memory")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Entries) != 12 {
		t.Fatalf("%d entries after AddAll, want 12", len(rec.Entries))
	}
	seen := map[string]bool{}
	for i, w := range writes {
		if seen[w] {
			t.Errorf("write %q done twice: %v", w, writes)
		}
		seen[w] = true
		if i > 0 && strings.HasPrefix(w, "create ") && w < writes[i-1] && strings.HasPrefix(writes[i-1], "create ") {
			t.Errorf("parts created out of order: %v", writes)
		}
	}
	if len(writes) < 3 || writes[0] != "update memory-erasure-record-0" {
		t.Errorf("writes %v: want the last part updated, then new parts created", writes)
	}
}
