package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
)

// mirrorProofSQL writes the proof of request $1; a later write replaces it
// only when its history is longer (a re-erasure appended to it) or, as
// long, it carries another receipt (one issued again after a lost status
// write): the history only grows.
const mirrorProofSQL = `INSERT INTO lethe.erasure_proofs AS p (request_uid, digest, envelope, key_id, issued_at, history, history_count)
	VALUES ($1, $2, $3, $4, $5, $6, $7)
	ON CONFLICT (request_uid) DO UPDATE SET digest = EXCLUDED.digest, envelope = EXCLUDED.envelope, key_id = EXCLUDED.key_id,
		issued_at = EXCLUDED.issued_at, history = EXCLUDED.history, history_count = EXCLUDED.history_count, recorded_at = now()
	WHERE EXCLUDED.history_count > p.history_count
	   OR EXCLUDED.history_count = p.history_count AND (EXCLUDED.envelope, EXCLUDED.digest) IS DISTINCT FROM (p.envelope, p.digest)`

// MirrorProof writes the request's proof into the database (erasure.Ledger).
func (e *Eraser) MirrorProof(ctx context.Context, p erasure.Proof) error {
	history, err := json.Marshal(p.History)
	if err != nil {
		return err
	}
	if _, err := e.Pool.Exec(ctx, mirrorProofSQL, p.UID, p.Digest, p.Envelope, p.KeyID, p.IssuedAt, string(history), len(p.History)); err != nil {
		return fmt.Errorf("mirror the proof into lethe.erasure_proofs (are Lethe's migrations applied?): %w", err)
	}
	return nil
}

// ReadProof reads the proof of the request uid from the database; found is
// false when there is none.
func (e *Eraser) ReadProof(ctx context.Context, uid string) (p erasure.Proof, found bool, err error) {
	var history []byte
	err = e.Pool.QueryRow(ctx, `SELECT request_uid, digest, envelope, key_id, issued_at, history FROM lethe.erasure_proofs WHERE request_uid = $1`, uid).
		Scan(&p.UID, &p.Digest, &p.Envelope, &p.KeyID, &p.IssuedAt, &history)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return p, false, nil
		}
		return p, false, fmt.Errorf("read the proof: %w", err)
	}
	return p, true, json.Unmarshal(history, &p.History)
}
