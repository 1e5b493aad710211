-- One receipt log per store, where 00012 kept one per database.
--
-- Stores sharing a database (one MemoryStore per tenant over one memory
-- database) shared its log: each store signed checkpoints of the whole log
-- under its own origin, and lethe.receipt_log_checkpoints, keyed by size
-- alone, kept only the first store's checkpoint of each size, so an
-- auditor's check of another store found no checkpoint of its log, or one
-- of another origin, and refused it. Each store's log now holds its own
-- receipts, and each checkpoint is kept under its origin.
--
--   lethe.receipt_log.origin          the log a leaf is in: the store's
--                                     origin (receiptlog.Origin, named by
--                                     its UID), '' for the leaves written
--                                     before this migration. Those are the
--                                     shared prefix of every store's log: a
--                                     store's log is its leaves after them,
--                                     its indexes going on from theirs, so
--                                     every checkpoint signed before still
--                                     covers a prefix of it.
--   lethe.receipt_log_checkpoints.origin
--                                     the origin the checkpoint names (its
--                                     first line; filled in for those kept).
--   lethe.erasure_proofs.log_origin   the log the proof's leaves go into ('':
--                                     none written since this migration).
--   lethe.record_proof(..., p_origin) the only way in, as before, appending
--                                     to the store's log. A request whose
--                                     store was deleted and created again
--                                     (a new UID, a new log) goes on in the
--                                     new one (a leaf of its history there
--                                     too, when the manager mirrors it
--                                     again); its earlier leaves stay in the
--                                     old. A request's leaf is looked for in
--                                     the store's log only. The
--                                     8-argument form is dropped: a manager
--                                     older than this migration fails its
--                                     mirror (and retries) rather than
--                                     append to the shared prefix.

-- +goose Up
ALTER TABLE lethe.receipt_log ADD COLUMN origin text NOT NULL DEFAULT '';
ALTER TABLE lethe.receipt_log ALTER COLUMN origin DROP DEFAULT;
ALTER TABLE lethe.receipt_log DROP CONSTRAINT receipt_log_pkey, ADD PRIMARY KEY (origin, idx),
    DROP CONSTRAINT receipt_log_request_uid_history_length_key, ADD UNIQUE (origin, request_uid, history_length);
ALTER TABLE lethe.receipt_log_checkpoints ADD COLUMN origin text NOT NULL DEFAULT '';
UPDATE lethe.receipt_log_checkpoints SET origin = split_part(checkpoint, E'\n', 1);
ALTER TABLE lethe.receipt_log_checkpoints ALTER COLUMN origin DROP DEFAULT;
ALTER TABLE lethe.receipt_log_checkpoints DROP CONSTRAINT receipt_log_checkpoints_pkey, ADD PRIMARY KEY (origin, size);
ALTER TABLE lethe.erasure_proofs ADD COLUMN log_origin text NOT NULL DEFAULT '';

DROP FUNCTION lethe.record_proof(text, text, text, text, text, timestamptz, jsonb, jsonb);

-- +goose StatementBegin
CREATE FUNCTION lethe.record_proof(p_uid text, p_format text, p_digest text, p_envelope text, p_key_id text,
        p_issued_at timestamptz, p_history jsonb, p_document jsonb, p_origin text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe, pg_temp AS $$
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
    IF p_origin IS NULL OR p_origin !~ '^lethe\.dev/receipts/[^[:cntrl:]]+$' THEN
        RAISE EXCEPTION 'record_proof: % is not the origin of a store''s receipt log', quote_nullable(p_origin) USING ERRCODE = 'LE003';
    END IF;
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
            SELECT idx INTO at_idx FROM lethe.receipt_log WHERE request_uid = p_uid AND history_length = n AND origin IN ('', p_origin);
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
            history = p_history, history_count = n, document = p_document, recorded_at = now(), log_origin = p_origin
        WHERE request_uid = p_uid AND (n > old.history_count OR old.document IS NULL);
    ELSE
        INSERT INTO lethe.erasure_proofs (request_uid, digest, envelope, key_id, issued_at, history, history_count, evidence_format, document, log_origin)
        VALUES (p_uid, p_digest, p_envelope, p_key_id, p_issued_at, p_history, n, p_format, p_document, p_origin);
    END IF;
    SELECT idx INTO at_idx FROM lethe.receipt_log WHERE request_uid = p_uid AND history_length = n AND origin IN ('', p_origin);
    IF FOUND THEN
        RETURN at_idx;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('lethe.receipt_log'), hashtext(p_origin));
    leaf := '{"format":"lethe.dev/evidence/v1","historyHead":' || to_json(head)::text
        || ',"historyLength":' || n || ',"request":' || to_json(p_uid)::text || '}';
    -- Each max reads one end of the primary key's index.
    SELECT coalesce(greatest((SELECT max(idx) FROM lethe.receipt_log WHERE origin = ''),
                             (SELECT max(idx) FROM lethe.receipt_log WHERE origin = p_origin)) + 1, 0) INTO at_idx;
    INSERT INTO lethe.receipt_log (origin, idx, request_uid, history_length, leaf_data, leaf_hash)
    VALUES (p_origin, at_idx, p_uid, n, leaf, sha256('\x00'::bytea || convert_to(leaf, 'UTF8')));
    -- The proof's last leaf is in this log now (its store created again, the same history).
    UPDATE lethe.erasure_proofs SET log_origin = p_origin WHERE request_uid = p_uid AND log_origin <> p_origin;
    RETURN at_idx;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION lethe.record_proof(text, text, text, text, text, timestamptz, jsonb, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lethe.record_proof(text, text, text, text, text, timestamptz, jsonb, jsonb, text) TO lethe_operator;

-- +goose Down
-- Down merges nothing back: it refuses a database holding a store's log.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM lethe.receipt_log WHERE origin <> '') THEN
        RAISE EXCEPTION 'the receipt log holds leaves of a store''s own log: 00023 cannot be undone without losing them';
    END IF;
    IF EXISTS (SELECT 1 FROM lethe.receipt_log_checkpoints GROUP BY size HAVING count(*) > 1) THEN
        RAISE EXCEPTION 'two stores kept a checkpoint of the same size: 00023 cannot be undone without losing one';
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION lethe.record_proof(text, text, text, text, text, timestamptz, jsonb, jsonb, text);
ALTER TABLE lethe.erasure_proofs DROP COLUMN log_origin;
ALTER TABLE lethe.receipt_log_checkpoints DROP CONSTRAINT receipt_log_checkpoints_pkey, ADD PRIMARY KEY (size);
ALTER TABLE lethe.receipt_log_checkpoints DROP COLUMN origin;
ALTER TABLE lethe.receipt_log DROP CONSTRAINT receipt_log_pkey, ADD PRIMARY KEY (idx),
    DROP CONSTRAINT receipt_log_origin_request_uid_history_length_key, ADD UNIQUE (request_uid, history_length);
ALTER TABLE lethe.receipt_log DROP COLUMN origin;
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
