package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// WithheldInclusions is shared by the ErasureRequest and MemoryStore
// reconcilers of one manager: the requests whose receipt-log inclusion a
// pass left out because their store's log did not extend the checkpoints
// its requests hold (ErasureRequestReconciler.inclusionWithheld), by store.
// The store's audit takes its store's when its log is found consistent
// again and wakes them (MemoryStoreReconciler.wakeUnlogged): the cache
// keeps too little of a completed request to find them there. The zero
// value is ready; a nil one records nothing.
type WithheldInclusions struct {
	mu      sync.Mutex
	byStore map[types.UID]map[types.UID]withheldRequest
	storeOf map[types.UID]types.UID
}

// withheldRequest is a request whose inclusion was left out, and the
// history length it was left out for.
type withheldRequest struct {
	uid    types.UID
	key    types.NamespacedName
	length int
}

// withhold records that request uid (key) of store had its inclusion left
// out for a history of length entries. It reports whether that is new:
// not recorded before for this length.
func (w *WithheldInclusions) withhold(store, uid types.UID, key types.NamespacedName, length int) bool {
	if w == nil {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byStore == nil {
		w.byStore, w.storeOf = map[types.UID]map[types.UID]withheldRequest{}, map[types.UID]types.UID{}
	}
	if old, ok := w.storeOf[uid]; ok && old != store {
		delete(w.byStore[old], uid)
	}
	reqs := w.byStore[store]
	if reqs == nil {
		reqs = map[types.UID]withheldRequest{}
		w.byStore[store] = reqs
	}
	prev, seen := reqs[uid]
	reqs[uid], w.storeOf[uid] = withheldRequest{uid: uid, key: key, length: length}, store
	return !seen || prev.length != length
}

// length is the history length request uid's inclusion was left out for.
func (w *WithheldInclusions) length(uid types.UID) (int, bool) {
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.byStore[w.storeOf[uid]][uid]
	return r.length, ok
}

// forget drops request uid: its inclusion was written, or it is gone.
func (w *WithheldInclusions) forget(uid types.UID) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if store, ok := w.storeOf[uid]; ok {
		delete(w.byStore[store], uid)
		delete(w.storeOf, uid)
	}
}

// take returns and drops the requests of store whose inclusion was left
// out: their next pass tries again, and records them again if it fails.
func (w *WithheldInclusions) take(store types.UID) []withheldRequest {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []withheldRequest
	for uid, r := range w.byStore[store] {
		out = append(out, r)
		delete(w.storeOf, uid)
	}
	delete(w.byStore, store)
	return out
}

// putBack records again a request take returned and could not wake,
// unless a pass recorded it (or another store's) since.
func (w *WithheldInclusions) putBack(store types.UID, r withheldRequest) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.storeOf[r.uid]; ok {
		return
	}
	if w.byStore[store] == nil {
		w.byStore[store] = map[types.UID]withheldRequest{}
	}
	w.byStore[store][r.uid], w.storeOf[r.uid] = r, store
}
