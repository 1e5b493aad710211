package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/evidence"
	"github.com/lethe-dev/lethe/internal/receiptlog"
)

// recordProofSQL writes the proof through lethe.record_proof (00012, its
// store's own log since 00023), which checks the chain, keeps the history
// growing only, and returns the proof's leaf index in the store's log.
const recordProofSQL = `SELECT lethe.record_proof($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9)`

// MirrorProof writes the request's proof into the database (erasure.Ledger).
func (e *Eraser) MirrorProof(ctx context.Context, p erasure.Proof) (int64, error) {
	history, err := json.Marshal(p.History)
	if err != nil {
		return 0, err
	}
	doc, err := json.Marshal(p.Document)
	if err != nil {
		return 0, err
	}
	var idx int64
	if err := e.Pool.QueryRow(ctx, recordProofSQL, p.UID, p.Format, p.Digest, p.Envelope, p.KeyID, p.IssuedAt, string(history), string(doc), p.Log).Scan(&idx); err != nil {
		return 0, fmt.Errorf("record the proof through lethe.record_proof (are Lethe's migrations applied?): %w", err)
	}
	return idx, nil
}

// proofMirroredSQL is true when lethe.record_proof would find the proof
// recorded as given and change nothing: same format, the same history
// (every entry, as jsonb) and document, and the history's leaf in the
// store's receipt log ($8, with the shared prefix) with this request's leaf
// hash ($6 < 0: at any index).
const proofMirroredSQL = `SELECT EXISTS (SELECT 1 FROM lethe.erasure_proofs p
	WHERE p.request_uid = $1 AND p.evidence_format = $2 AND p.history_count = $3
	  AND p.history = $4::jsonb AND p.document = $5::jsonb
	  AND EXISTS (SELECT 1 FROM lethe.receipt_log l WHERE l.origin IN ('', $8) AND l.request_uid = $1 AND l.history_length = $3
		AND l.leaf_hash = $7 AND ($6 < 0 OR l.idx = $6)))`

// ProofMirrored reports whether the database holds the proof as
// MirrorProof would leave it (erasure.Ledger).
func (e *Eraser) ProofMirrored(ctx context.Context, p erasure.Proof, index int64) (bool, error) {
	n := len(p.History)
	if n == 0 {
		return false, nil
	}
	history, err := json.Marshal(p.History)
	if err != nil {
		return false, err
	}
	doc, err := json.Marshal(p.Document)
	if err != nil {
		return false, err
	}
	leaf := receiptlog.LeafHash(evidence.LogLeaf(p.UID, p.History[n-1].Digest, n))
	var held bool
	if err := e.Pool.QueryRow(ctx, proofMirroredSQL, p.UID, p.Format, n, string(history), string(doc), index, leaf[:], p.Log).Scan(&held); err != nil {
		return false, fmt.Errorf("read whether the proof is mirrored: %w", err)
	}
	return held, nil
}

// logLeaves selects the leaves of the log $1: those written before 00023
// (origin empty: every store's shared prefix), then the store's own, whose
// indexes go on from them.
const logLeaves = `FROM lethe.receipt_log WHERE origin IN ('', $1) ORDER BY idx`

// ReceiptLog returns the leaf hashes of the store's receipt log (erasure.Ledger).
// A log whose indexes skip one lost a leaf: the error wraps
// receiptlog.ErrInconsistent, as for any log that does not extend what was
// signed (the leaves after the gap are not where their checkpoints had them).
func (e *Eraser) ReceiptLog(ctx context.Context, origin string) ([][32]byte, error) {
	rows, err := e.Pool.Query(ctx, `SELECT idx, leaf_hash `+logLeaves, origin)
	if err != nil {
		return nil, fmt.Errorf("read the receipt log: %w", err)
	}
	var out [][32]byte
	var idx int64
	var h []byte
	_, err = pgx.ForEachRow(rows, []any{&idx, &h}, func() error {
		if idx != int64(len(out)) {
			return fmt.Errorf("receipt log %s: leaf %d is missing, the next is %d (%w)", origin, len(out), idx, receiptlog.ErrInconsistent)
		}
		if len(h) != 32 {
			return fmt.Errorf("receipt log leaf %d is %d bytes", len(out), len(h))
		}
		out = append(out, [32]byte(h))
		return nil
	})
	return out, err
}

// WriteCheckpoint records a signed checkpoint of the log (erasure.Ledger).
func (e *Eraser) WriteCheckpoint(ctx context.Context, origin string, size int64, checkpoint string) error {
	_, err := e.Pool.Exec(ctx, `INSERT INTO lethe.receipt_log_checkpoints (origin, size, checkpoint) VALUES ($1, $2, $3)
		ON CONFLICT (origin, size) DO NOTHING`, origin, size, checkpoint)
	if err != nil {
		return fmt.Errorf("write the receipt log checkpoint: %w", err)
	}
	return nil
}

// ReadProof reads the proof of the request uid from the database; found is
// false when there is none.
func (e *Eraser) ReadProof(ctx context.Context, uid string) (p erasure.Proof, found bool, err error) {
	var history []byte
	var doc []byte
	err = e.Pool.QueryRow(ctx, `SELECT request_uid, digest, envelope, key_id, issued_at, history, evidence_format, document, log_origin
		FROM lethe.erasure_proofs WHERE request_uid = $1`, uid).
		Scan(&p.UID, &p.Digest, &p.Envelope, &p.KeyID, &p.IssuedAt, &history, &p.Format, &doc, &p.Log)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return p, false, nil
		}
		return p, false, fmt.Errorf("read the proof: %w", err)
	}
	if len(doc) > 0 {
		p.Document = json.RawMessage(doc)
	}
	return p, true, json.Unmarshal(history, &p.History)
}

// LogRecord is one leaf of the store's receipt log as the database holds it.
type LogRecord struct {
	Index         int64
	RequestUID    string
	HistoryLength int
	LeafData      string
	LeafHash      []byte
}

// StoredCheckpoint is a signed checkpoint the manager recorded.
type StoredCheckpoint struct {
	Size int64
	Note string
}

// ReadLog reads the whole receipt log named origin and its recorded
// checkpoints, for an auditor.
func (e *Eraser) ReadLog(ctx context.Context, origin string) ([]LogRecord, []StoredCheckpoint, error) {
	rows, err := e.Pool.Query(ctx, `SELECT idx, request_uid, history_length, leaf_data, leaf_hash `+logLeaves, origin)
	if err != nil {
		return nil, nil, fmt.Errorf("read the receipt log: %w", err)
	}
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[LogRecord])
	if err != nil {
		return nil, nil, fmt.Errorf("read the receipt log: %w", err)
	}
	rows, err = e.Pool.Query(ctx, `SELECT size, checkpoint FROM lethe.receipt_log_checkpoints WHERE origin = $1 ORDER BY size`, origin)
	if err != nil {
		return nil, nil, fmt.Errorf("read the receipt log's checkpoints: %w", err)
	}
	cps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[StoredCheckpoint])
	if err != nil {
		return nil, nil, fmt.Errorf("read the receipt log's checkpoints: %w", err)
	}
	return recs, cps, nil
}

// ReadProofs reads, for an auditor, every proof the receipt log origin
// must hold a leaf of (Proof.Log is origin, or empty: written before 00023)
// and every proof one of its leaves records (a leaf of the shared prefix
// may be of a proof that went on in another store's log).
func (e *Eraser) ReadProofs(ctx context.Context, origin string) ([]erasure.Proof, error) {
	rows, err := e.Pool.Query(ctx, `SELECT request_uid FROM lethe.erasure_proofs
		WHERE log_origin IN ('', $1) OR request_uid IN (SELECT request_uid FROM lethe.receipt_log WHERE origin IN ('', $1))
		ORDER BY recorded_at, request_uid`, origin)
	if err != nil {
		return nil, fmt.Errorf("read the proofs: %w", err)
	}
	uids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make([]erasure.Proof, 0, len(uids))
	for _, uid := range uids {
		p, _, err := e.ReadProof(ctx, uid)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
