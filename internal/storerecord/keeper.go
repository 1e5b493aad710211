package storerecord

import (
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// LabelStore names the MemoryStore on the record's ConfigMaps and key Secret.
	LabelStore = "erasure.lethe.dev/erasure-record"
	// AnnotationKeyID on each of the record's ConfigMaps is the fingerprint
	// (KeyID) of the key its entries are hashed with: a key Secret lost and
	// made again would match none of them.
	AnnotationKeyID = "erasure.lethe.dev/record-key-id"
	// keyField is the key's field in the Secret.
	keyField = "key"
	// DefaultShardBytes bounds one ConfigMap's data, well inside the API
	// server's 1 MiB.
	DefaultShardBytes = 512 << 10
)

func shardName(store string, n int) string { return fmt.Sprintf("%s-erasure-record-%d", store, n) }

// Keeper reads and writes the records. Reader must read from the API server
// itself (not a cache): a record read stale would be written back short.
type Keeper struct {
	Client client.Client
	Reader client.Reader
	// KeySecret holds the records' key, one for every store, in the
	// manager's own namespace (created on first use): the manager may
	// create Secrets there only.
	KeySecret types.NamespacedName
	// ShardBytes bounds one ConfigMap's data (DefaultShardBytes when zero).
	ShardBytes int
}

// Load reads the store's record; an empty record (no key) when none exists.
// A record whose key is gone, or was replaced, is an error: its entries
// would match no session.
func (k *Keeper) Load(ctx context.Context, namespace, store string) (Record, error) {
	rec := Record{Entries: map[string]Entry{}}
	shards, err := k.shards(ctx, namespace, store)
	if err != nil {
		return rec, err
	}
	key, err := k.key(ctx, false)
	switch {
	case err != nil:
		return rec, err
	case key == nil && len(shards) > 0:
		return rec, fmt.Errorf("the erasure record of %s exists but its key Secret %s is gone: restore the Secret from a backup (a new key would match none of its sessions)", store, k.KeySecret)
	case key == nil:
		return rec, nil
	}
	if err := sameKey(shards, key, k.KeySecret); err != nil {
		return rec, err
	}
	rec.Key = key
	for _, cm := range shards {
		for uid, s := range cm.Data {
			e, err := decode(uid, s)
			if err != nil {
				return rec, err
			}
			rec.Entries[uid] = e
		}
	}
	return rec, nil
}

// Add records what the request uid erased, creating the key on first use
// (never while any record exists: its entries would match nothing under a
// new one); a request already recorded is left as it is. A write conflict
// is returned: the caller retries.
func (k *Keeper) Add(ctx context.Context, namespace, store, uid string, entry func(key []byte) Entry) error {
	return k.AddAll(ctx, namespace, store, map[string]func(key []byte) Entry{uid: entry})
}

// AddAll records what each request of entries (by UID) erased, as Add
// does, with one write per part of the record it changes. Parts are
// created in order, so that an error leaves no gap.
func (k *Keeper) AddAll(ctx context.Context, namespace, store string, entries map[string]func(key []byte) Entry) error {
	key, err := k.key(ctx, true)
	if err != nil {
		return err
	}
	shards, err := k.shards(ctx, namespace, store)
	if err != nil {
		return err
	}
	if err := sameKey(shards, key, k.KeySecret); err != nil {
		return err
	}
	changed, fresh, err := k.place(namespace, store, shards, key, entries)
	if err != nil {
		return err
	}
	if changed != nil {
		// A part written before the fingerprint was kept gets it now.
		metav1.SetMetaDataAnnotation(&changed.ObjectMeta, AnnotationKeyID, KeyID(key))
		if err := k.Client.Update(ctx, changed); err != nil {
			return err
		}
	}
	for _, cm := range fresh {
		metav1.SetMetaDataAnnotation(&cm.ObjectMeta, AnnotationKeyID, KeyID(key))
		if err := k.Client.Create(ctx, cm); err != nil {
			return err
		}
	}
	return nil
}

// place puts the entries the record's parts lack into its last part while
// it has room, then into new parts: the last part if it changed, and the
// new parts in order.
func (k *Keeper) place(namespace, store string, shards []*corev1.ConfigMap, key []byte, entries map[string]func(key []byte) Entry) (changed *corev1.ConfigMap, fresh []*corev1.ConfigMap, err error) {
	var last *corev1.ConfigMap
	if n := len(shards); n > 0 {
		last = shards[n-1]
	}
	for _, uid := range slices.Sorted(maps.Keys(entries)) {
		if slices.ContainsFunc(shards, func(cm *corev1.ConfigMap) bool { _, ok := cm.Data[uid]; return ok }) {
			continue
		}
		s, err := encode(entries[uid](key))
		if err != nil {
			return nil, nil, err
		}
		if last == nil || size(last)+len(uid)+len(s) > k.shardBytes() {
			last = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: shardName(store, len(shards)+len(fresh)),
				Labels: map[string]string{LabelStore: store}}, Data: map[string]string{}}
			fresh = append(fresh, last)
		} else if len(fresh) == 0 {
			changed = last
		}
		if last.Data == nil {
			last.Data = map[string]string{}
		}
		last.Data[uid] = s
	}
	return changed, fresh, nil
}

// sameKey checks that every part of a record that says its key's
// fingerprint says key's.
func sameKey(shards []*corev1.ConfigMap, key []byte, secret types.NamespacedName) error {
	want := KeyID(key)
	for _, cm := range shards {
		if got, ok := cm.Annotations[AnnotationKeyID]; ok && got != want {
			return fmt.Errorf("the erasure record part %s was written under record key %s, the key Secret %s now holds %s: restore the Secret from a backup (entries would match no session under this one)",
				cm.Name, got, secret, want)
		}
	}
	return nil
}

// shards lists the store's record ConfigMaps in order.
func (k *Keeper) shards(ctx context.Context, namespace, store string) ([]*corev1.ConfigMap, error) {
	list := &corev1.ConfigMapList{}
	if err := k.Reader.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{LabelStore: store}); err != nil {
		return nil, fmt.Errorf("read the erasure record: %w", err)
	}
	var out []*corev1.ConfigMap
	for n := range len(list.Items) {
		i := slices.IndexFunc(list.Items, func(cm corev1.ConfigMap) bool { return cm.Name == shardName(store, n) })
		if i < 0 {
			return nil, fmt.Errorf("the erasure record of %s misses its part %d: restore it from a backup of the namespace", store, n)
		}
		out = append(out, &list.Items[i])
	}
	return out, nil
}

// RecordedUIDs are the requests every store's record in the cluster
// holds: a database may be shared by stores, and a store renamed leaves
// its record under its old name. Only the entries' names are read.
func (k *Keeper) RecordedUIDs(ctx context.Context) (map[string]bool, error) {
	list := &corev1.ConfigMapList{}
	if err := k.Reader.List(ctx, list, client.HasLabels{LabelStore}); err != nil {
		return nil, fmt.Errorf("read the erasure records: %w", err)
	}
	out := map[string]bool{}
	for _, cm := range list.Items {
		for uid := range cm.Data {
			out[uid] = true
		}
	}
	return out, nil
}

// noRecordYet refuses a new key while a record exists anywhere in the
// cluster: a lost key is put back, not replaced, for a record was hashed
// with it.
func (k *Keeper) noRecordYet(ctx context.Context) error {
	records := &corev1.ConfigMapList{}
	if err := k.Reader.List(ctx, records, client.HasLabels{LabelStore}, client.Limit(1)); err != nil {
		return fmt.Errorf("read the erasure records: %w", err)
	}
	if len(records.Items) > 0 {
		return fmt.Errorf("the erasure record key Secret %s is gone but records exist (%s/%s): restore the Secret from a backup; a new key would match none of their sessions",
			k.KeySecret, records.Items[0].Namespace, records.Items[0].Name)
	}
	return nil
}

// Writable reports why Add would refuse to record for the store (the key
// lost or replaced), without writing anything: a caller about to do what
// only the record will remember asks first.
func (k *Keeper) Writable(ctx context.Context, namespace, store string) error {
	key, err := k.key(ctx, false)
	if err != nil {
		return err
	}
	if key == nil {
		return k.noRecordYet(ctx)
	}
	shards, err := k.shards(ctx, namespace, store)
	if err != nil {
		return err
	}
	return sameKey(shards, key, k.KeySecret)
}

// key reads the records' key, creating it when create is set.
func (k *Keeper) key(ctx context.Context, create bool) ([]byte, error) {
	if k.KeySecret.Name == "" {
		return nil, fmt.Errorf("no erasure record key Secret is configured")
	}
	s := &corev1.Secret{}
	err := k.Reader.Get(ctx, k.KeySecret, s)
	switch {
	case err == nil:
		if len(s.Data[keyField]) < 32 {
			return nil, fmt.Errorf("secret %s: the erasure record key is missing or shorter than 32 bytes", k.KeySecret)
		}
		return s.Data[keyField], nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("read the erasure record key: %w", err)
	case !create:
		return nil, nil
	}
	if err := k.noRecordYet(ctx); err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: k.KeySecret.Namespace, Name: k.KeySecret.Name},
		Data: map[string][]byte{keyField: key}}
	if err := k.Client.Create(ctx, s); err != nil {
		// Another writer created it first: the caller retries and reads it.
		return nil, fmt.Errorf("create the erasure record key: %w", err)
	}
	return key, nil
}

func (k *Keeper) shardBytes() int {
	if k.ShardBytes > 0 {
		return k.ShardBytes
	}
	return DefaultShardBytes
}

func size(cm *corev1.ConfigMap) int {
	n := 0
	for k, v := range cm.Data {
		n += len(k) + len(v)
	}
	return n
}
