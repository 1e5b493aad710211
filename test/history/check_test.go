package history

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// check returns every violation of operator.md's invariants the record shows.
func check(rec runRecord) []string {
	c := &checker{rec: rec, p: rec.Plan, byUID: map[string]*plannedRequest{}, inRun: map[string]bool{},
		claimRV: map[string]int64{}, erased: map[string]bool{}, erasedTx: map[string]int64{}, receipts: map[string]int{}}
	for _, r := range c.p.Requests {
		c.byUID[r.UID] = r
	}
	for _, s := range append(slices.Clone(c.p.Own), c.p.Foreign, c.p.Unknown) {
		c.inRun[s] = true
	}
	for _, o := range rec.Statuses {
		if o.Claimed && c.claimRV[o.UID] == 0 {
			c.claimRV[o.UID] = o.RV
		}
	}
	// The database first: it says which sessions were validly erased.
	c.database()
	c.requests()
	c.rows()
	c.graph()
	c.velero()
	c.phasesStay()
	c.leftovers()
	c.reingestions()
	c.receiptLog()
	if rec.Restore != nil {
		c.restored()
	}
	for i := range c.v {
		c.v[i] = fmt.Sprintf("run %d (seed %d): %s", c.p.ID, c.p.Seed, c.v[i])
	}
	return c.v
}

// checker holds one run's record and what the checks learn on the way.
type checker struct {
	rec     runRecord
	p       *runPlan
	byUID   map[string]*plannedRequest
	inRun   map[string]bool  // every session ID the run knows
	claimRV map[string]int64 // request UID → first version with the deletion claimed
	// Filled by database():
	erased   map[string]bool  // sessions deleted by a valid request
	erasedTx map[string]int64 // session → the transaction that deleted it
	receipts map[string]int   // "request/step/batch" → receipts written
	v        []string
}

func (c *checker) bad(format string, args ...any) { c.v = append(c.v, fmt.Sprintf(format, args...)) }

func (c *checker) final(r *plannedRequest) lethev1.Phase {
	if er := c.rec.Final[r.Name]; er != nil {
		return er.Status.Phase
	}
	return ""
}

// database checks the committed statements: deletions, tombstones,
// derived records, receipts.
func (c *checker) database() {
	// Database effects, in commit order of their rows. The ledger says which
	// request a deletion acted for: its erased_at is set in the deleting
	// transaction.
	ledger, erasedIn := c.ledgerOf(c.rec.Effects)
	var derivedDeletes []dbEffect
	for _, e := range c.rec.Effects {
		switch e.Table {
		case "memory.sessions":
			id := str(e.Old, "id")
			if id == "" {
				id = str(e.New, "id")
			}
			if !c.inRun[id] {
				continue
			}
			switch e.Op {
			case "DELETE":
				if msg := c.validDeletion(ledger, erasedIn[e.Txid], e); msg != "" {
					c.bad("session %s deleted outside a valid request: %s", id, msg)
				} else {
					c.erased[id], c.erasedTx[id] = true, e.Txid
				}
			case "UPDATE":
				before, after := str(e.Old, "tombstoned_by"), str(e.New, "tombstoned_by")
				switch {
				case after != "" && after != before:
					r := c.byUID[after]
					if r == nil || !slices.Contains(r.Sessions, id) || str(e.Old, "tenant_id") != c.p.Tenant {
						c.bad("session %s tombstoned by %q, which did not request it for this tenant", id, after)
					}
				case after == "" && before != "":
					if !anyCancelled(c.p, id) {
						c.bad("session %s had its tombstone lifted though no request naming it was cancelled", id)
					}
				}
			}
		case "lethe.erasure_receipts":
			uid := str(e.New, "request_uid")
			if uid == "" {
				uid = str(e.Old, "request_uid")
			}
			if c.byUID[uid] == nil {
				continue
			}
			if e.Op != "INSERT" {
				c.bad("receipt of %s changed (%s): receipts are append-only", uid, e.Op)
				continue
			}
			c.receipts[fmt.Sprintf("%s/%v/%v", c.byUID[uid].Name, e.New["step"], e.New["batch"])]++
		case "memory_derived.derivations":
			if c.inRun[str(e.Old, "source_session_id")] {
				derivedDeletes = append(derivedDeletes, e)
			}
		}
	}
	// A derived record goes in the transaction that erases its source.
	for _, e := range derivedDeletes {
		if src := str(e.Old, "source_session_id"); !c.erased[src] || c.erasedTx[src] != e.Txid {
			c.bad("a record derived from session %s was deleted outside the transaction that erased it", src)
		}
	}
	for k, n := range c.receipts {
		if n != 1 {
			c.bad("receipt %s written %d times", k, n)
		}
	}
}

// requests checks each request: completion, cancel respected, one history
// entry per step, append-only histories.
func (c *checker) requests() {
	// Each request: completion, cancel respected, one history entry per step.
	for _, r := range c.p.Requests {
		er := c.rec.Final[r.Name]
		if er == nil {
			c.bad("request %s has no final state", r.Name)
			continue
		}
		phase := er.Status.Phase
		if !requestDone(phase) {
			c.bad("request %s did not complete: phase %q", r.Name, phase)
		}
		if r.CancelRV != 0 && c.claimRV[r.UID] != 0 && c.claimRV[r.UID] > r.CancelRV {
			c.bad("request %s claimed the deletion (rv %d) after its cancel was accepted (rv %d)", r.Name, c.claimRV[r.UID], r.CancelRV)
		}
		if phase == lethev1.PhaseCancelled && c.claimRV[r.UID] != 0 {
			c.bad("request %s is Cancelled though it claimed the deletion", r.Name)
		}
		if phase == lethev1.PhaseCancelled && r.CancelRV == 0 {
			c.bad("request %s is Cancelled though nobody cancelled it", r.Name)
		}
		if err := evidence.VerifyChain(evidence.ChainOf(er)); err != nil {
			c.bad("request %s: history chain does not verify: %v", r.Name, err)
		}
		// The whole proof, as an auditor checks it: signatures, evidence,
		// receipt and its place in the store's log.
		switch {
		case len(c.rec.KeySet.Keys) == 0:
			// The checker's own unit tests plant histories without keys.
		case er.Status.EvidenceFormat == "":
			c.bad("request %s: its history has no evidence format (a legacy chain)", r.Name)
		default:
			c.checkProof(r.Name, er)
		}

		seen := map[string]int{}
		for _, h := range er.Status.History {
			if h.Event == lethev1.ReasonResurrected {
				continue
			}
			seen[string(h.Phase)]++
		}
		for ph, n := range seen {
			if n != 1 {
				var entries []string
				for _, h := range er.Status.History {
					entries = append(entries, fmt.Sprintf("%s/%s@%s", h.Phase, h.Event, h.Time.UTC().Format(time.RFC3339)))
				}
				var versions []string
				for _, o := range c.rec.Statuses {
					if o.UID == r.UID {
						versions = append(versions, fmt.Sprintf("rv %d: %d entries, %v", o.RV, len(o.History), o.Conditions))
					}
				}
				c.bad("request %s: history has %d %s entries: %s; versions seen: %s", r.Name, n, ph, strings.Join(entries, " "), strings.Join(versions, "; "))
			}
		}
		if seen[string(lethev1.PhaseCancelled)] > 0 && seen[string(lethev1.PhaseDeleted)] > 0 {
			c.bad("request %s is both Cancelled and Deleted", r.Name)
		}
		if phase == lethev1.PhaseBackupsRotated {
			for _, step := range []string{"Tombstoned", "Deleted", "GraphReconciled"} {
				if !hasReceipt(c.receipts, r.Name, step) && er.Status.Plan != nil && er.Status.Plan.SessionsFound > 0 && hasOwnSession(c.p, r) {
					c.bad("request %s completed without a %s receipt", r.Name, step)
				}
			}
		}
	}
	// The history is append-only as observed: each version extends the last.
	last := map[string][]string{}
	for _, o := range c.rec.Statuses {
		if c.byUID[o.UID] == nil || o.Deleted {
			continue
		}
		prev := last[o.UID]
		if len(o.History) < len(prev) || !slices.Equal(o.History[:len(prev)], prev) {
			c.bad("request %s: history was rewritten between versions (rv %d)", c.byUID[o.UID].Name, o.RV)
		}
		last[o.UID] = o.History
	}

}

// rows checks that what was not validly erased is untouched and what was is
// gone: its rows, and the cache entries of its content. After a restore,
// the end state is the re-erasure's: what was erased is gone again, and the
// rest is as the dump held it, which is as it was before the round.
func (c *checker) rows() {
	// Rows: what was not validly erased is untouched; what was is gone.
	mustErase := map[string]bool{}
	for _, r := range c.p.Requests {
		if c.final(r) == lethev1.PhaseBackupsRotated {
			for _, s := range r.Sessions {
				if slices.Contains(c.p.Own, s) {
					mustErase[s] = true
				}
			}
		}
	}
	for _, s := range append(slices.Clone(c.p.Own), c.p.Foreign) {
		erased := mustErase[s] || c.erased[s]
		switch {
		case erased && c.rec.RowsAfter[s] != 0:
			c.bad("session %s: %d rows left after its request completed", s, c.rec.RowsAfter[s])
		case !erased && c.rec.RowsAfter[s] != c.rec.RowsBefore[s]:
			c.bad("session %s was not erased but has %d rows, had %d", s, c.rec.RowsAfter[s], c.rec.RowsBefore[s])
		}
		if c.rec.CacheBefore == nil {
			continue
		}
		switch {
		case erased && c.rec.CacheAfter[s] != 0:
			c.bad("session %s: %d content-keyed cache entries of its content left after its erasure", s, c.rec.CacheAfter[s])
		case !erased && c.rec.CacheAfter[s] != c.rec.CacheBefore[s]:
			c.bad("session %s was not erased but has %d cache entries of its content, had %d", s, c.rec.CacheAfter[s], c.rec.CacheBefore[s])
		}
	}
}

// graph checks the graph writes and the graph left afterwards.
func (c *checker) graph() {
	// Graph: writes name only validly erased sessions; what is left is
	// exactly the first graph without the erased sessions' elements.
	for _, w := range c.rec.GraphWrites {
		if w.Key != c.p.GraphKey {
			continue
		}
		for _, id := range w.IDs {
			if !c.erased[id] {
				c.bad("graph write on %s named session %s, which was not erased", w.Key, id)
			}
		}
	}
	for el, n := range c.rec.GraphBefore {
		if strings.HasPrefix(el, "Entity ") || mentionsAny(el, c.erased) {
			continue
		}
		if c.rec.GraphAfter[el] != n {
			c.bad("graph element %q: %d before, %d after, though none of its sessions was erased", el, n, c.rec.GraphAfter[el])
		}
	}
	endpoints := map[string]bool{}
	for el := range c.rec.GraphAfter {
		if mentionsAny(el, c.erased) {
			c.bad("graph element %q of an erased session is still there", el)
		}
		if f := strings.Fields(el); len(f) > 0 && strings.Contains(f[len(f)-1], ">") {
			a, b, _ := strings.Cut(f[len(f)-1], ">")
			endpoints[a], endpoints[b] = true, true
		}
	}
	for el := range c.rec.GraphAfter {
		if f := strings.Fields(el); len(f) >= 2 && f[0] == "Entity" && !endpoints[f[1]] {
			c.bad("entity %q was left with no relationship", f[1])
		}
	}
}

// velero checks the Backups and DeleteBackupRequests.
func (c *checker) velero() {
	// Velero: the decoy is never touched, the run's Backup never gets a
	// later expiration, delete requests only for immediate erasures, one per Backup.
	var lastExp *time.Time
	for _, b := range c.rec.Backups {
		switch b.Name {
		case c.p.Decoy:
			if len(b.Annotations) > 0 || b.Deleted {
				c.bad("another application's Backup %s was changed", b.Name)
			}
		case c.p.Backup:
			if lastExp != nil && b.Expiration != nil && b.Expiration.After(*lastExp) {
				c.bad("Backup %s expiration lengthened from %s to %s", b.Name, lastExp, b.Expiration)
			}
			if b.Expiration != nil {
				lastExp = b.Expiration
			}
		}
	}
	perBackup := map[string]int{}
	for _, d := range c.rec.DBRs {
		if (d.BackupName != c.p.Backup && d.BackupName != c.p.Decoy) || !d.ByLethe {
			continue
		}
		if d.BackupName == c.p.Decoy {
			c.bad("a DeleteBackupRequest named another application's Backup %s", d.BackupName)
		}
		perBackup[d.BackupUID]++
		if !immediateErased(c.p, c.erased) {
			c.bad("DeleteBackupRequest %s without an immediate erasure", d.Name)
		}
		if !c.p.DeleteOnImmediate {
			c.bad("DeleteBackupRequest %s though the store's deleteOnImmediate is off", d.Name)
		}
	}
	for uid, n := range perBackup {
		if n > 1 {
			c.bad("%d DeleteBackupRequests for Backup uid %s", n, uid)
		}
	}
}

// ledgerRow is one request's ledger entry for one session, as recorded.
type ledgerRow struct {
	tombstoned, graceEnds time.Time
	cancelledSeq          int64
}

// ledgerOf reads the session ledger rows of the run's requests from
// effects: each row by request UID + "/" + session, and per transaction the
// rows it marked erased.
func (c *checker) ledgerOf(effects []dbEffect) (map[string]*ledgerRow, map[int64][]string) {
	ledger := map[string]*ledgerRow{}
	erasedIn := map[int64][]string{}
	for _, e := range effects {
		if e.Table != "lethe.erasure_ledger" || str(e.New, "scope") != "session" || c.byUID[str(e.New, "request_uid")] == nil {
			continue
		}
		k := str(e.New, "request_uid") + "/" + str(e.New, "record_id")
		l := ledger[k]
		if l == nil {
			l = &ledgerRow{}
			ledger[k] = l
		}
		if e.Op == "INSERT" {
			l.graceEnds, _ = timeOf(e.New, "grace_ends_at")
			l.tombstoned, _ = timeOf(e.New, "tombstoned_at")
		}
		if str(e.Old, "cancelled_at") == "" && str(e.New, "cancelled_at") != "" {
			l.cancelledSeq = e.Seq
		}
		if str(e.Old, "erased_at") == "" && str(e.New, "erased_at") != "" {
			erasedIn[e.Txid] = append(erasedIn[e.Txid], k)
		}
	}
	return ledger, erasedIn
}

// validDeletion says why a recorded session DELETE was not allowed ("" if
// it was): the same transaction must mark the session erased in the ledger
// for a request of this run that named it, for this tenant, tombstoned,
// not cancelled, past its grace period by the database's clock, and with
// the deletion claimed in the request's status.
func (c *checker) validDeletion(ledger map[string]*ledgerRow, marked []string, e dbEffect) string {
	p, id := c.p, str(e.Old, "id")
	var r *plannedRequest
	var l *ledgerRow
	for _, k := range marked {
		uid, rec, _ := strings.Cut(k, "/")
		if rec == id {
			r, l = c.byUID[uid], ledger[k]
		}
	}
	switch {
	case r == nil || l == nil:
		return "no request of this run marked it erased in the deleting transaction"
	case !slices.Contains(r.Sessions, id):
		return fmt.Sprintf("request %s did not name it", r.Name)
	case str(e.Old, "tenant_id") != p.Tenant:
		return fmt.Sprintf("tenant %q is not the store's", str(e.Old, "tenant_id"))
	case str(e.Old, "tombstoned_by") == "":
		return "it was not tombstoned"
	case l.cancelledSeq != 0 && l.cancelledSeq < e.Seq:
		return fmt.Sprintf("request %s had cancelled it in the ledger", r.Name)
	case c.final(r) == lethev1.PhaseCancelled:
		return fmt.Sprintf("request %s ended Cancelled", r.Name)
	case c.claimRV[r.UID] == 0:
		return fmt.Sprintf("request %s never claimed the deletion in its status", r.Name)
	}
	if !r.Immediate {
		if l.graceEnds.Before(l.tombstoned.Add(r.Grace)) {
			return fmt.Sprintf("the ledger's grace period ends at %s, less than %s after the tombstone at %s", l.graceEnds, r.Grace, l.tombstoned)
		}
		if e.At.Before(l.graceEnds) {
			return fmt.Sprintf("deleted at %s, before request %s's grace period ended at %s (database clock)", e.At, r.Name, l.graceEnds)
		}
	}
	return ""
}

func anyCancelled(p *runPlan, id string) bool {
	for _, r := range p.Requests {
		if r.CancelRV != 0 && slices.Contains(r.Sessions, id) {
			return true
		}
	}
	return false
}

func hasReceipt(receipts map[string]int, name, step string) bool {
	for k := range receipts {
		if strings.HasPrefix(k, name+"/"+step+"/") {
			return true
		}
	}
	return false
}

// hasOwnSession: the request named one of the tenant's sessions that no
// earlier request had already erased (one that finds nothing left to
// delete writes no Deleted receipt).
func hasOwnSession(p *runPlan, r *plannedRequest) bool {
	for _, s := range r.Sessions {
		if slices.Contains(p.Own, s) {
			return true
		}
	}
	return false
}

func immediateErased(p *runPlan, erased map[string]bool) bool {
	for _, r := range p.Requests {
		if !r.Immediate {
			continue
		}
		for _, s := range r.Sessions {
			if erased[s] {
				return true
			}
		}
	}
	return false
}

func mentionsAny(el string, ids map[string]bool) bool {
	for _, id := range uuidPattern.FindAllString(el, -1) {
		if ids[id] {
			return true
		}
	}
	return false
}

// checkProof verifies the request's whole proof as an auditor does:
// signatures, evidence, receipt and its place in the store's log.
func (c *checker) checkProof(name string, er *lethev1.ErasureRequest) {
	rep, err := evidence.VerifyRequest(context.Background(), er, evidence.Options{KeySet: c.rec.KeySet})
	switch {
	case err != nil:
		c.bad("request %s: its proof does not verify: %v", name, err)
	case rep.InProgress:
		c.bad("request %s: its evidence changed after its last history entry", name)
	}
}
