package storerecord

import (
	"context"
	"crypto/rand"
	"fmt"
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
func (k *Keeper) Load(ctx context.Context, namespace, store string) (Record, error) {
	rec := Record{Entries: map[string]Entry{}}
	key, err := k.key(ctx, false)
	if err != nil || key == nil {
		return rec, err
	}
	rec.Key = key
	shards, err := k.shards(ctx, namespace, store)
	if err != nil {
		return rec, err
	}
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

// Add records what the request uid erased, creating the key on first use;
// a request already recorded is left as it is. A write conflict is
// returned: the caller retries.
func (k *Keeper) Add(ctx context.Context, namespace, store, uid string, entry func(key []byte) Entry) error {
	key, err := k.key(ctx, true)
	if err != nil {
		return err
	}
	shards, err := k.shards(ctx, namespace, store)
	if err != nil {
		return err
	}
	for _, cm := range shards {
		if _, ok := cm.Data[uid]; ok {
			return nil
		}
	}
	s, err := encode(entry(key))
	if err != nil {
		return err
	}
	if n := len(shards); n > 0 && size(shards[n-1])+len(uid)+len(s) <= k.shardBytes() {
		cm := shards[n-1]
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[uid] = s
		return k.Client.Update(ctx, cm)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: shardName(store, len(shards)),
		Labels: map[string]string{LabelStore: store}}, Data: map[string]string{uid: s}}
	return k.Client.Create(ctx, cm)
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
