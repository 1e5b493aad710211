-- The erasure-support objects Lethe needs in any memory database it serves,
-- in schema "lethe". Adopters with their own memory schema apply this one.
--
--   lethe.erasure_ledger     identifiers only, never content: which records
--                            each request tombstoned, erased or cancelled.
--   lethe.erasure_receipts   one row per (request, step, batch), written in
--                            the same transaction as the step's effect.
--   lethe.is_erased()        the ledger check read paths and policies use.
--   lethe.content_indexes, lethe.content_sources, lethe.lineage_tables
--                            the registry of residue classes a cascade
--                            misses: content-keyed indexes, the columns that
--                            hold the content hashes, and lineage tables of
--                            derived records. Lethe cleans what is listed.
--   lethe.refuse_erased_lineage()
--                            trigger function for derived tables: raises
--                            SQLSTATE LE001 (erasure_lineage_violation) when a
--                            new derived row names an erased source.

-- +goose Up
CREATE SCHEMA IF NOT EXISTS lethe;

CREATE TABLE lethe.erasure_ledger (
    -- 'session' for a memory session, 'content' for a content hash. Content
    -- rows are never marked erased one by one (the receipts count what was
    -- removed); while not cancelled they keep the hash hidden.
    scope         text        NOT NULL CHECK (scope IN ('session', 'content')),
    record_id     text        NOT NULL,
    request_uid   text        NOT NULL,
    tenant_id     text,
    tombstoned_at timestamptz NOT NULL DEFAULT now(),
    grace_ends_at timestamptz,
    erased_at     timestamptz,
    cancelled_at  timestamptz,
    -- Request first: every step reads one request's rows.
    PRIMARY KEY (request_uid, scope, record_id),
    -- A record is never both cancelled and erased by one request.
    CONSTRAINT ledger_erased_xor_cancelled CHECK (erased_at IS NULL OR cancelled_at IS NULL)
);
CREATE INDEX erasure_ledger_active_idx ON lethe.erasure_ledger (scope, record_id) WHERE cancelled_at IS NULL;

CREATE TABLE lethe.erasure_receipts (
    request_uid text        NOT NULL,
    step        text        NOT NULL,
    batch       integer     NOT NULL DEFAULT 0,
    sessions    integer     NOT NULL DEFAULT 0,
    counts      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    digest      text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_uid, step, batch)
);

-- A table keyed by the sha256 (hex) of content rather than by record: a
-- cascade never reaches it, so Lethe deletes the keys of erased content.
CREATE TABLE lethe.content_indexes (
    index_table regclass PRIMARY KEY,
    key_column  name NOT NULL
);

-- A column, on a table that cascades from sessions (or on sessions), holding
-- the sha256 (hex) of content that may be a key of a content index.
CREATE TABLE lethe.content_sources (
    source_table regclass NOT NULL,
    hash_column  name     NOT NULL,
    PRIMARY KEY (source_table, hash_column)
);

-- A lineage table naming, for each derived record, a source session. Lethe
-- deletes the derived records (derived_table.derived_key = lineage.derived_column)
-- of erased sessions before it deletes the sessions.
CREATE TABLE lethe.lineage_tables (
    lineage_table  regclass PRIMARY KEY,
    source_column  name     NOT NULL,
    derived_column name     NOT NULL,
    derived_table  regclass NOT NULL,
    derived_key    name     NOT NULL
);

-- is_erased: true while a request holds the record tombstoned or erased (a
-- cancelled entry does not count). SECURITY DEFINER so that application roles
-- can use it in policies without reading the ledger itself.
CREATE FUNCTION lethe.is_erased(p_scope text, p_record_id text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT EXISTS (
        SELECT 1 FROM lethe.erasure_ledger
        WHERE scope = p_scope AND record_id = p_record_id AND cancelled_at IS NULL
    )
$$;
REVOKE ALL ON FUNCTION lethe.is_erased(text, text) FROM PUBLIC;

-- refuse_erased_lineage: BEFORE INSERT OR UPDATE trigger for lineage tables.
-- TG_ARGV[0] names the column that holds the source session ID.
-- +goose StatementBegin
CREATE FUNCTION lethe.refuse_erased_lineage() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
DECLARE
    source text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
    IF source IS NULL THEN
        RAISE EXCEPTION 'lineage column "%" missing on %.%', TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME;
    END IF;
    IF lethe.is_erased('session', source) THEN
        RAISE EXCEPTION 'refusing to derive from erased source session %', source
            USING ERRCODE = 'LE001',
                  HINT = 'the source is tombstoned or erased by a Lethe ErasureRequest; drop it from the derivation';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP SCHEMA lethe CASCADE;
