-- The proof in the database is written only through a function that checks
-- it, and every proof written is a leaf of an append-only Merkle tree log.
--
--   lethe.erasure_proofs     gains the evidence format and the evidence
--                            document (plan, step evidence, the sessions
--                            asked for, as docs/evidence-format.md defines
--                            it), so a proof read here verifies like the
--                            request object. lethe_operator loses INSERT and
--                            UPDATE on it.
--   lethe.record_proof(...)  the only way in: it recomputes every history
--                            digest of a lethe.dev/evidence/v1 chain (links
--                            only for a legacy chain), refuses a history
--                            that does not extend the one recorded (the old
--                            one an exact prefix), refuses a receipt whose
--                            digest is no entry's, and appends the leaf
--                            {format, historyHead, historyLength, request}
--                            to the log, computed here from the history it
--                            checked. It returns the leaf's index (an
--                            existing leaf of the same request and length
--                            is returned, not added twice; a stale writer's
--                            shorter history, a prefix of the recorded one,
--                            changes nothing; the same history with other
--                            evidence is refused, the first proof of a
--                            history is kept).
--   lethe.receipt_log        the leaves, index from 0, never updated or
--                            deleted by lethe_operator.
--   lethe.receipt_log_checkpoints
--                            the signed checkpoints (C2SP tlog-checkpoint
--                            notes) the manager wrote, one per log size;
--                            INSERT only.
--
-- The signatures (entries, receipt, checkpoints) are the manager's and are
-- checked by the auditor (kubectl erasure receipts); what the database can
-- check without the key, it checks here.

-- +goose Up
ALTER TABLE lethe.erasure_proofs
    ADD COLUMN evidence_format text  NOT NULL DEFAULT '',
    ADD COLUMN document        jsonb;
REVOKE INSERT, UPDATE ON lethe.erasure_proofs FROM lethe_operator;

CREATE TABLE lethe.receipt_log (
    idx            bigint      PRIMARY KEY CHECK (idx >= 0),
    request_uid    text        NOT NULL,
    history_length integer     NOT NULL,
    leaf_data      text        NOT NULL,
    leaf_hash      bytea       NOT NULL CHECK (length(leaf_hash) = 32),
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (request_uid, history_length)
);
CREATE TABLE lethe.receipt_log_checkpoints (
    size        bigint      PRIMARY KEY CHECK (size > 0),
    checkpoint  text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON lethe.receipt_log, lethe.receipt_log_checkpoints FROM PUBLIC;
GRANT SELECT ON lethe.receipt_log TO lethe_operator;
GRANT SELECT, INSERT ON lethe.receipt_log_checkpoints TO lethe_operator;

-- lethe.entry_digest is the lethe.dev/evidence/v1 digest of history entry
-- e of request uid: sha256 over the RFC 8785 form of an object of strings
-- (to_json escapes a string as RFC 8785 does; the members are written in
-- sorted order).
-- +goose StatementBegin
CREATE FUNCTION lethe.entry_digest(uid text, e jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, lethe AS $$
    SELECT 'sha256:' || encode(sha256(convert_to(
        '{"event":' || to_json(coalesce(e->>'event', ''))::text
        || ',"evidenceDigest":' || to_json(coalesce(e->>'evidenceDigest', ''))::text
        || ',"format":"lethe.dev/evidence/v1"'
        || ',"keyID":' || to_json(coalesce(e->>'keyID', ''))::text
        || ',"phase":' || to_json(coalesce(e->>'phase', ''))::text
        || ',"previousDigest":' || to_json(coalesce(e->>'previousDigest', ''))::text
        || ',"request":' || to_json(uid)::text
        || ',"time":' || to_json(coalesce(e->>'time', ''))::text
        || '}', 'UTF8')), 'hex')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION lethe.record_proof(p_uid text, p_format text, p_digest text, p_envelope text, p_key_id text,
        p_issued_at timestamptz, p_history jsonb, p_document jsonb) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe AS $$
DECLARE
    n      integer := jsonb_array_length(p_history);
    prev   text := '';
    e      jsonb;
    i      integer := 0;
    old    lethe.erasure_proofs;
    head   text;
    leaf   text;
    at_idx bigint;
BEGIN
    IF p_format NOT IN ('', 'lethe.dev/evidence/v1') THEN
        RAISE EXCEPTION 'record_proof: unknown evidence format %', p_format USING ERRCODE = 'LE003';
    END IF;
    IF n = 0 THEN
        RAISE EXCEPTION 'record_proof: an empty history' USING ERRCODE = 'LE003';
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(p_history) AS x LOOP
        IF coalesce(e->>'previousDigest', '') <> prev THEN
            RAISE EXCEPTION 'record_proof: history entry % does not link to entry %', i, i - 1 USING ERRCODE = 'LE003';
        END IF;
        IF p_format <> '' AND e->>'digest' IS DISTINCT FROM lethe.entry_digest(p_uid, e) THEN
            RAISE EXCEPTION 'record_proof: history entry % does not recompute', i USING ERRCODE = 'LE003';
        END IF;
        prev := e->>'digest';
        i := i + 1;
    END LOOP;
    head := prev;
    IF NOT p_history @> jsonb_build_array(jsonb_build_object('digest', p_digest)) THEN
        RAISE EXCEPTION 'record_proof: the receipt covers no entry of the history' USING ERRCODE = 'LE003';
    END IF;
    -- One writer per request at a time; the log's next index is taken under its own lock.
    PERFORM pg_advisory_xact_lock(hashtext('lethe.record_proof'), hashtext(p_uid));
    SELECT * INTO old FROM lethe.erasure_proofs WHERE request_uid = p_uid;
    IF FOUND THEN
        IF old.evidence_format <> p_format THEN
            RAISE EXCEPTION 'record_proof: the evidence format may not change' USING ERRCODE = 'LE003';
        END IF;
        IF old.history_count > n THEN
            -- A stale writer: its history must be a prefix of the one recorded; nothing changes.
            IF (SELECT jsonb_agg(x ORDER BY k) FROM jsonb_array_elements(old.history) WITH ORDINALITY AS t(x, k)
                    WHERE k <= n) IS DISTINCT FROM p_history THEN
                RAISE EXCEPTION 'record_proof: the history does not match the one recorded for this request' USING ERRCODE = 'LE003';
            END IF;
            SELECT idx INTO at_idx FROM lethe.receipt_log WHERE request_uid = p_uid AND history_length = n;
            RETURN coalesce(at_idx, -1);
        END IF;
        IF (SELECT jsonb_agg(x ORDER BY k) FROM jsonb_array_elements(p_history) WITH ORDINALITY AS t(x, k)
                WHERE k <= old.history_count) IS DISTINCT FROM old.history THEN
            RAISE EXCEPTION 'record_proof: the history does not extend the one recorded for this request' USING ERRCODE = 'LE003';
        END IF;
        IF n = old.history_count AND old.document IS NOT NULL AND p_document IS DISTINCT FROM old.document THEN
            RAISE EXCEPTION 'record_proof: the evidence differs from the one recorded with this history' USING ERRCODE = 'LE003';
        END IF;
        -- The first proof of a history stays: a repeat (another process, a
        -- lost status write) changes nothing.
        UPDATE lethe.erasure_proofs SET digest = p_digest, envelope = p_envelope, key_id = p_key_id, issued_at = p_issued_at,
            history = p_history, history_count = n, document = p_document, recorded_at = now()
        WHERE request_uid = p_uid AND (n > old.history_count OR old.document IS NULL);
    ELSE
        INSERT INTO lethe.erasure_proofs (request_uid, digest, envelope, key_id, issued_at, history, history_count, evidence_format, document)
        VALUES (p_uid, p_digest, p_envelope, p_key_id, p_issued_at, p_history, n, p_format, p_document);
    END IF;
    SELECT idx INTO at_idx FROM lethe.receipt_log WHERE request_uid = p_uid AND history_length = n;
    IF FOUND THEN
        RETURN at_idx;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('lethe.receipt_log'));
    leaf := '{"format":"lethe.dev/evidence/v1","historyHead":' || to_json(head)::text
        || ',"historyLength":' || n || ',"request":' || to_json(p_uid)::text || '}';
    SELECT coalesce(max(idx) + 1, 0) INTO at_idx FROM lethe.receipt_log;
    INSERT INTO lethe.receipt_log (idx, request_uid, history_length, leaf_data, leaf_hash)
    VALUES (at_idx, p_uid, n, leaf, sha256('\x00'::bytea || convert_to(leaf, 'UTF8')));
    RETURN at_idx;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION lethe.record_proof(text, text, text, text, text, timestamptz, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lethe.record_proof(text, text, text, text, text, timestamptz, jsonb, jsonb) TO lethe_operator;

-- +goose Down
DROP FUNCTION lethe.record_proof(text, text, text, text, text, timestamptz, jsonb, jsonb);
DROP FUNCTION lethe.entry_digest(text, jsonb);
DROP TABLE lethe.receipt_log_checkpoints;
DROP TABLE lethe.receipt_log;
GRANT INSERT, UPDATE (digest, envelope, key_id, issued_at, history, history_count, recorded_at) ON lethe.erasure_proofs TO lethe_operator;
ALTER TABLE lethe.erasure_proofs DROP COLUMN document, DROP COLUMN evidence_format;
