package history

import (
	"fmt"
	"slices"
	"strings"
	"time"

	lethev1 "github.com/lethe-dev/lethe/api/v1alpha1"
	"github.com/lethe-dev/lethe/internal/evidence"
)

// plannedRequest is one ErasureRequest of a run, as the run created it.
type plannedRequest struct {
	Name      string
	Sessions  []string
	Immediate bool
	Grace     time.Duration
	// CancelAfter is when the run sets spec.cancel (0: never).
	CancelAfter time.Duration
	UID         string
	// CancelRV is the resource version of the accepted cancel (0: none).
	CancelRV int64
}

// runPlan is what a run set up: its tenant's sessions, the requests, the
// Backups and the graph.
type runPlan struct {
	ID       int
	Seed     uint64
	NS       string
	Tenant   string
	GraphKey string
	Own      []string // the tenant's sessions
	Foreign  string   // another tenant's session, named by a request
	Unknown  string   // a requested ID that never existed
	Requests []*plannedRequest
	Backup   string // selected by the run's store
	Decoy    string // another application's Backup
}

// runRecord is everything recorded during a run's round, and the end state.
type runRecord struct {
	Plan        *runPlan
	Effects     []dbEffect
	Statuses    []statusObs
	Backups     []backupObs
	DBRs        []dbrObs
	GraphWrites []graphWrite
	Final       map[string]*lethev1.ErasureRequest // by request name
	GraphBefore map[string]int
	GraphAfter  map[string]int
	RowsBefore  map[string]int64 // rows per session in every table that references it
	RowsAfter   map[string]int64
}

// check returns every violation of operator.md's invariants the record shows.
func check(rec runRecord) []string {
	p := rec.Plan
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }

	byUID := map[string]*plannedRequest{}
	for _, r := range p.Requests {
		byUID[r.UID] = r
	}
	inRun := map[string]bool{p.Foreign: true, p.Unknown: true}
	for _, s := range p.Own {
		inRun[s] = true
	}
	final := func(r *plannedRequest) lethev1.Phase {
		if er := rec.Final[r.Name]; er != nil {
			return er.Status.Phase
		}
		return ""
	}
	claimRV := map[string]int64{}
	for _, o := range rec.Statuses {
		if o.Claimed && claimRV[o.UID] == 0 {
			claimRV[o.UID] = o.RV
		}
	}

	// Database effects, in commit order of their rows. The ledger says which
	// request a deletion acted for: its erased_at is set in the deleting
	// transaction.
	ledger := map[string]*ledgerRow{} // request UID + "/" + session
	erasedIn := map[int64][]string{}  // txid → request UID + "/" + session marked erased
	for _, e := range rec.Effects {
		if e.Table != "lethe.erasure_ledger" || str(e.New, "scope") != "session" || byUID[str(e.New, "request_uid")] == nil {
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
	erased := map[string]bool{}    // sessions deleted by a valid request
	erasedTx := map[string]int64{} // session → deleting transaction
	receipts := map[string]int{}
	var derivedDeletes []dbEffect
	for _, e := range rec.Effects {
		switch e.Table {
		case "memory.sessions":
			id := str(e.Old, "id")
			if id == "" {
				id = str(e.New, "id")
			}
			if !inRun[id] {
				continue
			}
			switch e.Op {
			case "DELETE":
				if msg := validDeletion(p, byUID, ledger, erasedIn[e.Txid], e, claimRV, final); msg != "" {
					bad("session %s deleted outside a valid request: %s", id, msg)
				} else {
					erased[id], erasedTx[id] = true, e.Txid
				}
			case "UPDATE":
				before, after := str(e.Old, "tombstoned_by"), str(e.New, "tombstoned_by")
				switch {
				case after != "" && after != before:
					r := byUID[after]
					if r == nil || !slices.Contains(r.Sessions, id) || str(e.Old, "tenant_id") != p.Tenant {
						bad("session %s tombstoned by %q, which did not request it for this tenant", id, after)
					}
				case after == "" && before != "":
					if !anyCancelled(p, id) {
						bad("session %s had its tombstone lifted though no request naming it was cancelled", id)
					}
				}
			}
		case "lethe.erasure_receipts":
			uid := str(e.New, "request_uid")
			if uid == "" {
				uid = str(e.Old, "request_uid")
			}
			if byUID[uid] == nil {
				continue
			}
			if e.Op != "INSERT" {
				bad("receipt of %s changed (%s): receipts are append-only", uid, e.Op)
				continue
			}
			receipts[fmt.Sprintf("%s/%v/%v", byUID[uid].Name, e.New["step"], e.New["batch"])]++
		case "memory_derived.derivations":
			if inRun[str(e.Old, "source_session_id")] {
				derivedDeletes = append(derivedDeletes, e)
			}
		}
	}
	// A derived record goes in the transaction that erases its source.
	for _, e := range derivedDeletes {
		if src := str(e.Old, "source_session_id"); !erased[src] || erasedTx[src] != e.Txid {
			bad("a record derived from session %s was deleted outside the transaction that erased it", src)
		}
	}
	for k, n := range receipts {
		if n != 1 {
			bad("receipt %s written %d times", k, n)
		}
	}

	// Each request: completion, cancel respected, one history entry per step.
	for _, r := range p.Requests {
		er := rec.Final[r.Name]
		if er == nil {
			bad("request %s has no final state", r.Name)
			continue
		}
		phase := er.Status.Phase
		if phase != lethev1.PhaseBackupsRotated && phase != lethev1.PhaseCancelled {
			bad("request %s did not complete: phase %q", r.Name, phase)
		}
		if r.CancelRV != 0 && claimRV[r.UID] != 0 && claimRV[r.UID] > r.CancelRV {
			bad("request %s claimed the deletion (rv %d) after its cancel was accepted (rv %d)", r.Name, claimRV[r.UID], r.CancelRV)
		}
		if phase == lethev1.PhaseCancelled && claimRV[r.UID] != 0 {
			bad("request %s is Cancelled though it claimed the deletion", r.Name)
		}
		if phase == lethev1.PhaseCancelled && r.CancelRV == 0 {
			bad("request %s is Cancelled though nobody cancelled it", r.Name)
		}
		if err := evidence.Verify(er.Status.History); err != nil {
			bad("request %s: history chain does not verify: %v", r.Name, err)
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
				for _, o := range rec.Statuses {
					if o.UID == r.UID {
						versions = append(versions, fmt.Sprintf("rv %d: %d entries, %v", o.RV, len(o.History), o.Conditions))
					}
				}
				bad("request %s: history has %d %s entries: %s; versions seen: %s", r.Name, n, ph, strings.Join(entries, " "), strings.Join(versions, "; "))
			}
		}
		if seen[string(lethev1.PhaseCancelled)] > 0 && seen[string(lethev1.PhaseDeleted)] > 0 {
			bad("request %s is both Cancelled and Deleted", r.Name)
		}
		if phase == lethev1.PhaseBackupsRotated {
			for _, step := range []string{"Tombstoned", "Deleted", "GraphReconciled"} {
				if !hasReceipt(receipts, r.Name, step) && er.Status.Plan != nil && er.Status.Plan.SessionsFound > 0 && hasOwnSession(p, r) {
					bad("request %s completed without a %s receipt", r.Name, step)
				}
			}
		}
	}
	// The history is append-only as observed: each version extends the last.
	last := map[string][]string{}
	for _, o := range rec.Statuses {
		if byUID[o.UID] == nil || o.Deleted {
			continue
		}
		prev := last[o.UID]
		if len(o.History) < len(prev) || !slices.Equal(o.History[:len(prev)], prev) {
			bad("request %s: history was rewritten between versions (rv %d)", byUID[o.UID].Name, o.RV)
		}
		last[o.UID] = o.History
	}

	// Rows: what was not validly erased is untouched; what was is gone.
	mustErase := map[string]bool{}
	for _, r := range p.Requests {
		if final(r) == lethev1.PhaseBackupsRotated {
			for _, s := range r.Sessions {
				if slices.Contains(p.Own, s) {
					mustErase[s] = true
				}
			}
		}
	}
	for _, s := range append(slices.Clone(p.Own), p.Foreign) {
		switch {
		case mustErase[s] && rec.RowsAfter[s] != 0:
			bad("session %s: %d rows left after its request completed", s, rec.RowsAfter[s])
		case !mustErase[s] && !erased[s] && rec.RowsAfter[s] != rec.RowsBefore[s]:
			bad("session %s was not erased but has %d rows, had %d", s, rec.RowsAfter[s], rec.RowsBefore[s])
		}
	}

	// Graph: writes name only validly erased sessions; what is left is
	// exactly the first graph without the erased sessions' elements.
	for _, w := range rec.GraphWrites {
		if w.Key != p.GraphKey {
			continue
		}
		for _, id := range w.IDs {
			if !erased[id] {
				bad("graph write on %s named session %s, which was not erased", w.Key, id)
			}
		}
	}
	for el, n := range rec.GraphBefore {
		if strings.HasPrefix(el, "Entity ") || mentionsAny(el, erased) {
			continue
		}
		if rec.GraphAfter[el] != n {
			bad("graph element %q: %d before, %d after, though none of its sessions was erased", el, n, rec.GraphAfter[el])
		}
	}
	endpoints := map[string]bool{}
	for el := range rec.GraphAfter {
		if mentionsAny(el, erased) {
			bad("graph element %q of an erased session is still there", el)
		}
		if f := strings.Fields(el); len(f) > 0 && strings.Contains(f[len(f)-1], ">") {
			a, b, _ := strings.Cut(f[len(f)-1], ">")
			endpoints[a], endpoints[b] = true, true
		}
	}
	for el := range rec.GraphAfter {
		if f := strings.Fields(el); len(f) >= 2 && f[0] == "Entity" && !endpoints[f[1]] {
			bad("entity %q was left with no relationship", f[1])
		}
	}

	// Velero: the decoy is never touched, the run's Backup never gets a
	// later expiration, delete requests only for immediate erasures, one per Backup.
	var lastExp *time.Time
	for _, b := range rec.Backups {
		switch b.Name {
		case p.Decoy:
			if len(b.Annotations) > 0 || b.Deleted {
				bad("another application's Backup %s was changed", b.Name)
			}
		case p.Backup:
			if lastExp != nil && b.Expiration != nil && b.Expiration.After(*lastExp) {
				bad("Backup %s expiration lengthened from %s to %s", b.Name, lastExp, b.Expiration)
			}
			if b.Expiration != nil {
				lastExp = b.Expiration
			}
		}
	}
	perBackup := map[string]int{}
	for _, d := range rec.DBRs {
		if d.BackupName != p.Backup && d.BackupName != p.Decoy {
			continue
		}
		if d.BackupName == p.Decoy {
			bad("a DeleteBackupRequest named another application's Backup %s", d.BackupName)
		}
		perBackup[d.BackupUID]++
		if !immediateErased(p, erased) {
			bad("DeleteBackupRequest %s without an immediate erasure", d.Name)
		}
	}
	for uid, n := range perBackup {
		if n > 1 {
			bad("%d DeleteBackupRequests for Backup uid %s", n, uid)
		}
	}
	for i := range v {
		v[i] = fmt.Sprintf("run %d (seed %d): %s", p.ID, p.Seed, v[i])
	}
	return v
}

// ledgerRow is one request's ledger entry for one session, as recorded.
type ledgerRow struct {
	tombstoned, graceEnds time.Time
	cancelledSeq          int64
}

// validDeletion says why a recorded session DELETE was not allowed ("" if
// it was): the same transaction must mark the session erased in the ledger
// for a request of this run that named it, for this tenant, tombstoned,
// not cancelled, past its grace period by the database's clock, and with
// the deletion claimed in the request's status.
func validDeletion(p *runPlan, byUID map[string]*plannedRequest, ledger map[string]*ledgerRow, marked []string, e dbEffect, claimRV map[string]int64, final func(*plannedRequest) lethev1.Phase) string {
	id := str(e.Old, "id")
	var r *plannedRequest
	var l *ledgerRow
	for _, k := range marked {
		uid, rec, _ := strings.Cut(k, "/")
		if rec == id {
			r, l = byUID[uid], ledger[k]
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
	case final(r) == lethev1.PhaseCancelled:
		return fmt.Sprintf("request %s ended Cancelled", r.Name)
	case claimRV[r.UID] == 0:
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
