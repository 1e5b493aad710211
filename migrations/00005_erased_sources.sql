-- Erased sources: an erased session's transcript file stays on disk (the
-- memory system keeps the raw files as the user's), and the next backfill
-- would ingest it again under a new session ID that nothing links to the
-- erasure. The ledger therefore also records a keyed hash of each erased
-- session's source identifier (scope 'source'), and a trigger on the
-- sessions table refuses a session from such a source with SQLSTATE LE002.
--
--   lethe.erasure_key          one random key per database: the source and
--                              content hashes in the ledger are HMACs with it,
--                              so the ledger is no dictionary of paths
--   lethe.source_columns       registry: the column of the sessions table
--                              holding the source identifier
--   lethe.source_hash(text)    the keyed hash (SECURITY DEFINER: the key is
--                              readable by nobody else)
--   lethe.refuse_erased_source trigger function, TG_ARGV[0] the column
--   lethe.source_releases      deliberate re-ingestion: a release recorded
--                              after the erasure lifts the refusal; written
--                              only through lethe.release_source(text),
--                              which nobody may run until granted it

-- +goose Up
CREATE EXTENSION IF NOT EXISTS pgcrypto WITH SCHEMA lethe;

ALTER TABLE lethe.erasure_ledger DROP CONSTRAINT erasure_ledger_scope_check;
ALTER TABLE lethe.erasure_ledger ADD CONSTRAINT erasure_ledger_scope_check
    CHECK (scope IN ('session', 'content', 'source'));

CREATE TABLE lethe.erasure_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key       bytea   NOT NULL
);
INSERT INTO lethe.erasure_key (key) VALUES (lethe.gen_random_bytes(32));
REVOKE ALL ON lethe.erasure_key FROM PUBLIC;

CREATE TABLE lethe.source_columns (
    source_table  regclass PRIMARY KEY,
    source_column name     NOT NULL
);

CREATE TABLE lethe.source_releases (
    record_id   text        NOT NULL,
    released_at timestamptz NOT NULL DEFAULT now(),
    released_by text        NOT NULL DEFAULT session_user,
    PRIMARY KEY (record_id, released_at)
);

CREATE FUNCTION lethe.source_hash(p_source text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT encode(lethe.hmac(convert_to(p_source, 'UTF8'), key, 'sha256'), 'hex') FROM lethe.erasure_key
$$;
REVOKE ALL ON FUNCTION lethe.source_hash(text) FROM PUBLIC;

-- +goose StatementBegin
CREATE FUNCTION lethe.refuse_erased_source() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
DECLARE
    source text := to_jsonb(NEW) ->> TG_ARGV[0];
    h text;
BEGIN
    IF source IS NULL THEN
        RETURN NEW;
    END IF;
    h := lethe.source_hash(source);
    IF EXISTS (
        SELECT 1 FROM lethe.erasure_ledger l
        WHERE l.scope = 'source' AND l.record_id = h AND l.cancelled_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM lethe.source_releases r WHERE r.record_id = h AND r.released_at > l.tombstoned_at)
    ) THEN
        -- The source identifier itself is never echoed: a path can name a person.
        RAISE EXCEPTION 'refusing to ingest erased source %', left(h, 16)
            USING ERRCODE = 'LE002',
                  HINT = 'a Lethe ErasureRequest erased the sessions of this source: skip it and delete the transcript file; a deliberate re-ingestion needs lethe.release_source';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE FUNCTION lethe.release_source(p_source text) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    INSERT INTO lethe.source_releases (record_id) VALUES (lethe.source_hash(p_source))
$$;
REVOKE ALL ON FUNCTION lethe.release_source(text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION lethe.release_source(text);
DROP FUNCTION lethe.refuse_erased_source();
DROP FUNCTION lethe.source_hash(text);
DROP TABLE lethe.source_releases;
DROP TABLE lethe.source_columns;
DROP TABLE lethe.erasure_key;
DELETE FROM lethe.erasure_ledger WHERE scope = 'source';
ALTER TABLE lethe.erasure_ledger DROP CONSTRAINT erasure_ledger_scope_check;
ALTER TABLE lethe.erasure_ledger ADD CONSTRAINT erasure_ledger_scope_check CHECK (scope IN ('session', 'content'));
DROP EXTENSION IF EXISTS pgcrypto;
