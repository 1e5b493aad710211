-- The proof outlives the request object. When a request completes, Lethe
-- writes its signed receipt (the DSSE envelope) and its history (the hash
-- chain of its milestones: phases, times, digests; no content, no session
-- ID) into the database it erased from; a later re-erasure's Resurrected
-- entries are appended. An auditor can then verify the erasure after the
-- ErasureRequest was deleted (a GitOps prune, a namespace clean-up).
--
--   lethe.erasure_proofs   one row per request: the receipt's digest, its
--                          envelope and signing key ID (empty when unsigned),
--                          when it was issued, and the history as JSON.
--
-- The receipt mirrored here is anonymous: signed over the same history, its
-- statement names the request by UID only (a request's name, such as
-- forget-john-smith, stays in its namespace). Only lethe_operator reads the
-- table. A restore of the database takes the rows
-- back with it; the requests write theirs again (a request already deleted
-- does not: its proof is then only in backups of the database).

-- +goose Up
CREATE TABLE lethe.erasure_proofs (
    request_uid   text        PRIMARY KEY,
    digest        text        NOT NULL,
    envelope      text        NOT NULL DEFAULT '',
    key_id        text        NOT NULL DEFAULT '',
    issued_at     timestamptz NOT NULL,
    history       jsonb       NOT NULL,
    history_count integer     NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON lethe.erasure_proofs FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE (digest, envelope, key_id, issued_at, history, history_count, recorded_at)
    ON lethe.erasure_proofs TO lethe_operator;

-- +goose Down
DROP TABLE lethe.erasure_proofs;
