package history

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
)

// The checks of the restore and re-ingestion faults.

// phasesStay checks that a request that reached BackupsRotated or Cancelled
// stays there in every later version observed: no going back, restore or not.
func (c *checker) phasesStay() {
	done := map[string]lethev1.Phase{}
	for _, o := range c.rec.Statuses {
		r := c.byUID[o.UID]
		if r == nil || o.Deleted {
			continue
		}
		if was, ok := done[o.UID]; ok && o.Phase != was {
			c.bad("request %s went from %s back to %q (rv %d)", r.Name, was, o.Phase, o.RV)
			continue
		}
		if requestDone(o.Phase) {
			done[o.UID] = o.Phase
		}
	}
}

// leftovers checks the end state once every request is done: no session of
// the run is still tombstoned (a completed request erased its sessions, a
// cancelled one lifted or handed over its tombstones), and a request that
// ended Cancelled holds no ledger row in force (its sources would be
// refused, its content hidden, by a request that was undone).
func (c *checker) leftovers() {
	for _, s := range append(slices.Clone(c.p.Own), c.p.Foreign) {
		if by := c.rec.TombstonedAfter[s]; by != "" {
			name := by
			if r := c.byUID[by]; r != nil {
				name = "request " + r.Name + " (" + string(c.final(r)) + ")"
			}
			c.bad("session %s is still tombstoned by %s after every request ended", s, name)
		}
	}
	for _, r := range c.p.Requests {
		if n := c.rec.InForceAfter[r.UID]; n > 0 && c.final(r) == lethev1.PhaseCancelled {
			c.bad("request %s ended Cancelled, but %d of its ledger rows are not cancelled (its history: %s)", r.Name, n, historyOf(c.rec.Final[r.Name]))
		}
	}
}

// historyOf lists a request's history entries, for a report.
func historyOf(er *lethev1.ErasureRequest) string {
	if er == nil {
		return "none"
	}
	var entries []string
	for _, h := range er.Status.History {
		e := string(h.Phase)
		if h.Event != "" {
			e += "/" + h.Event
		}
		entries = append(entries, e)
	}
	return strings.Join(entries, " ")
}

// reingestions checks each attempt to ingest a transcript again against the
// ledger as the attempt's snapshot saw it, from the recorded effects (those
// after the restore for an attempt on the restored database, which starts
// from the dump, taken before the round's requests):
//   - refused (LE002) exactly when a ledger row in force (not cancelled)
//     held its source erased;
//   - a session held erased in the ledger has its source held with it
//     (they are written in one transaction);
//   - once the run's erasures hold, an erased session's transcript is
//     refused and any other accepted.
func (c *checker) reingestions() {
	for _, a := range c.rec.Reingestions {
		effects := c.rec.Effects
		if a.AfterRestore {
			if c.rec.Restore == nil {
				c.bad("a re-ingestion attempt read a restored database, but no restore was recorded")
				continue
			}
			effects = c.rec.Restore.EffectsAfter
		}
		what := fmt.Sprintf("re-ingestion of session %s's transcript (snapshot %d:%d", a.Session, a.Snapshot.xmin, a.Snapshot.xmax)
		if a.AfterRestore {
			what += ", after the restore"
		}
		if a.Final {
			what += ", once the erasures held"
		}
		what += ")"
		session, source := ledgerHolds(effects, a)
		switch {
		case a.Refused && !source:
			c.bad("%s was refused, though no ledger row in force held its source erased", what)
		case !a.Refused && source:
			c.bad("%s was accepted, though a ledger row in force held its source erased", what)
		}
		if session && !source {
			c.bad("%s: the ledger held the session erased but not its source", what)
		}
		switch {
		case a.Final && c.erased[a.Session] && !a.Refused:
			c.bad("%s was accepted, though the session was erased", what)
		case a.Final && !c.erased[a.Session] && a.Refused:
			c.bad("%s was refused, though the session was not erased", what)
		}
	}
}

// ledgerHolds replays, of the recorded effects, those the attempt's
// snapshot saw committed on the ledger rows of its session and of its
// source's hash, and says whether a row in force (not cancelled) held each.
func ledgerHolds(effects []dbEffect, a reingestion) (session, source bool) {
	rows := map[string]map[string]any{} // request UID + "/" + scope
	for _, e := range effects {
		if e.Table != "lethe.erasure_ledger" || !a.Snapshot.visible(e.Txid) {
			continue
		}
		row := e.New
		if e.Op == "DELETE" {
			row = e.Old
		}
		scope, id := str(row, "scope"), str(row, "record_id")
		if (scope != "session" || id != a.Session) && (scope != "source" || id != a.Hash) {
			continue
		}
		k := str(row, "request_uid") + "/" + scope
		if e.Op == "DELETE" {
			delete(rows, k)
		} else {
			rows[k] = e.New
		}
	}
	for k, row := range rows {
		if str(row, "cancelled_at") != "" {
			continue
		}
		if strings.HasSuffix(k, "/session") {
			session = true
		} else {
			source = true
		}
	}
	return session, source
}

// restored checks a run whose round restored the database: what was
// waited for, the effects after the restore, and each request's history.
func (c *checker) restored() {
	c.v = append(c.v, c.rec.Restore.Findings...)
	c.databaseAfter()
	for _, r := range c.p.Requests {
		at, now := c.rec.Restore.AtRestore[r.Name], c.rec.Final[r.Name]
		if at == nil || now == nil || r.Name == c.rec.Restore.Deleted {
			continue
		}
		if now.Status.Phase != at.Status.Phase {
			c.bad("request %s was %s at the restore and is %s after it", r.Name, at.Status.Phase, now.Status.Phase)
		}
		if !meta.IsStatusConditionTrue(at.Status.Conditions, lethev1.ConditionDeleted) {
			continue
		}
		if n := len(at.Status.History); len(now.Status.History) < n || resurrections(now.Status.History[n:]) == 0 {
			c.bad("request %s had deleted its sessions, but its history has no Resurrected entry after the restore brought them back "+
				"(the database has %d Resurrected receipt(s) of it from after the restore)", r.Name, c.receiptsAfter(r.UID, lethev1.ReasonResurrected))
		}
	}
}

// databaseAfter checks the effects after the restore: a session of the run
// is deleted again only by a request that had erased it before the restore
// (the same checks as before it, the grace period served then), in a
// transaction that marks it erased; nothing lifts a tombstone or brings a
// session back; a derived record goes with its source; the only receipts
// are Resurrected ones, each written once.
func (c *checker) databaseAfter() {
	heldBefore := map[string]bool{} // request UID + "/" + session erased before the restore
	for _, e := range c.rec.Effects {
		if e.Table == "lethe.erasure_ledger" && str(e.New, "scope") == "session" && str(e.New, "erased_at") != "" {
			heldBefore[str(e.New, "request_uid")+"/"+str(e.New, "record_id")] = true
		}
	}
	after := c.rec.Restore.EffectsAfter
	_, erasedIn := c.ledgerOf(after)
	erasedTx := map[string]int64{}
	receipts := map[string]int{}
	var derivedDeletes []dbEffect
	for _, e := range after {
		switch e.Table {
		case "memory.sessions":
			c.sessionAfter(e, heldBefore, erasedIn[e.Txid], erasedTx)
		case "lethe.erasure_receipts":
			uid := str(e.New, "request_uid")
			if uid == "" {
				uid = str(e.Old, "request_uid")
			}
			r := c.byUID[uid]
			switch {
			case r == nil:
			case e.Op != "INSERT":
				c.bad("after the restore, a receipt of %s changed (%s): receipts are append-only", r.Name, e.Op)
			case str(e.New, "step") != lethev1.ReasonResurrected:
				c.bad("after the restore, request %s wrote a %v receipt: only a re-erasure (Resurrected) is due", r.Name, e.New["step"])
			default:
				receipts[fmt.Sprintf("%s/%v/%v", r.Name, e.New["step"], e.New["batch"])]++
			}
		case "memory_derived.derivations":
			if c.inRun[str(e.Old, "source_session_id")] {
				derivedDeletes = append(derivedDeletes, e)
			}
		}
	}
	for _, e := range derivedDeletes {
		if src := str(e.Old, "source_session_id"); erasedTx[src] != e.Txid {
			c.bad("after the restore, a record derived from session %s was deleted outside the transaction that erased it again", src)
		}
	}
	for k, n := range receipts {
		if n != 1 {
			c.bad("receipt %s written %d times after the restore", k, n)
		}
	}
}

// sessionAfter checks one effect on a session of the run after the restore.
func (c *checker) sessionAfter(e dbEffect, heldBefore map[string]bool, marked []string, erasedTx map[string]int64) {
	id := str(e.Old, "id")
	if e.Op == "INSERT" {
		id = str(e.New, "id")
	}
	if !c.inRun[id] {
		return
	}
	switch e.Op {
	case "INSERT":
		c.bad("session %s was inserted after the restore", id)
	case "DELETE":
		if msg := c.validReerasure(heldBefore, marked, e); msg != "" {
			c.bad("session %s deleted after the restore outside a valid re-erasure: %s", id, msg)
			return
		}
		erasedTx[id] = e.Txid
	case "UPDATE":
		before, after := str(e.Old, "tombstoned_by"), str(e.New, "tombstoned_by")
		switch {
		case after != "" && after != before:
			if r := c.byUID[after]; r == nil || !heldBefore[after+"/"+id] || str(e.Old, "tenant_id") != c.p.Tenant {
				c.bad("session %s tombstoned after the restore by %q, which had not erased it for this tenant", id, after)
			}
		case after == "" && before != "":
			c.bad("session %s had its tombstone lifted after the restore", id)
		}
	}
}

// validReerasure says why a session DELETE after the restore was not a
// valid re-erasure ("" if it was): the same transaction marks it erased in
// the ledger for a request of this run that named it, for this tenant,
// tombstoned, and that request had erased it before the restore.
func (c *checker) validReerasure(heldBefore map[string]bool, marked []string, e dbEffect) string {
	id := str(e.Old, "id")
	var r *plannedRequest
	for _, k := range marked {
		if uid, rec, _ := strings.Cut(k, "/"); rec == id {
			r = c.byUID[uid]
		}
	}
	switch {
	case r == nil:
		return "no request of this run marked it erased in the deleting transaction"
	case !slices.Contains(r.Sessions, id):
		return fmt.Sprintf("request %s did not name it", r.Name)
	case str(e.Old, "tenant_id") != c.p.Tenant:
		return fmt.Sprintf("tenant %q is not the store's", str(e.Old, "tenant_id"))
	case str(e.Old, "tombstoned_by") == "":
		return "it was not tombstoned"
	case !heldBefore[r.UID+"/"+id]:
		return fmt.Sprintf("request %s had not erased it before the restore", r.Name)
	}
	return ""
}

// receiptsAfter counts the receipts of step the request uid wrote after the restore.
func (c *checker) receiptsAfter(uid, step string) int {
	n := 0
	for _, e := range c.rec.Restore.EffectsAfter {
		if e.Table == "lethe.erasure_receipts" && e.Op == "INSERT" && str(e.New, "request_uid") == uid && str(e.New, "step") == step {
			n++
		}
	}
	return n
}
