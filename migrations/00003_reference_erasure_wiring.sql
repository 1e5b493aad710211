-- Wires the erasure-support objects into the reference memory schema:
--
-- * the residue registry: the embedding cache is a content index keyed by the
--   hashes in sessions.summary_sha256, rounds/facts/file_snapshots.content_sha256;
--   profiles are derived records with their lineage in derivations;
-- * the lineage guard on memory_derived.derivations (SQLSTATE LE001);
-- * row-level security for the application role "memory_app": a tombstoned
--   session, every row that belongs to it, every derived record whose lineage
--   names it and every cache entry of its content are invisible, so a raw
--   query that forgets "tombstoned_at IS NULL" still cannot read them.
--
-- Table owners (and Lethe, until it gets its own role) are not subject to
-- these policies; the application must connect as a member of memory_app.

-- +goose Up
INSERT INTO lethe.content_indexes (index_table, key_column) VALUES
    ('memory_derived.embedding_cache', 'content_sha256');
INSERT INTO lethe.content_sources (source_table, hash_column) VALUES
    ('memory.sessions', 'summary_sha256'),
    ('memory.rounds', 'content_sha256'),
    ('memory.facts', 'content_sha256'),
    ('memory.file_snapshots', 'content_sha256');
INSERT INTO lethe.lineage_tables (lineage_table, source_column, derived_column, derived_table, derived_key) VALUES
    ('memory_derived.derivations', 'source_session_id', 'derived_id', 'memory_derived.profiles', 'id');

CREATE TRIGGER derivations_refuse_erased_lineage
    BEFORE INSERT OR UPDATE ON memory_derived.derivations
    FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_lineage('source_session_id');

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'memory_app') THEN
        CREATE ROLE memory_app NOLOGIN;
    END IF;
END
$$;
-- +goose StatementEnd

GRANT USAGE ON SCHEMA memory, memory_derived TO memory_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA memory TO memory_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA memory_derived TO memory_app;
GRANT USAGE ON SCHEMA lethe TO memory_app;
GRANT EXECUTE ON FUNCTION lethe.is_erased(text, text) TO memory_app;

ALTER TABLE memory.sessions ENABLE ROW LEVEL SECURITY;
-- The application may read, write and remove live sessions. It cannot see a
-- tombstoned one, nor one the ledger holds erased (a session restored from a
-- pre-erasure backup stays hidden until Lethe erases it again), and it cannot
-- write a tombstone itself.
CREATE POLICY app_live_sessions ON memory.sessions TO memory_app
    USING (tombstoned_at IS NULL AND NOT lethe.is_erased('session', id::text))
    WITH CHECK (tombstoned_at IS NULL);

-- Child rows are visible exactly when their session is: the sub-query on
-- sessions is itself filtered by the policy above.
-- +goose StatementBegin
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['rounds', 'facts', 'fact_corrections', 'artifacts', 'file_snapshots'] LOOP
        EXECUTE format('ALTER TABLE memory.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY app_live_session_rows ON memory.%I TO memory_app
            USING (EXISTS (SELECT 1 FROM memory.sessions s WHERE s.id = session_id))', t);
    END LOOP;
END
$$;
-- +goose StatementEnd

ALTER TABLE memory.backfill_progress ENABLE ROW LEVEL SECURITY;
CREATE POLICY app_live_session_rows ON memory.backfill_progress TO memory_app
    USING (session_id IS NULL OR EXISTS (SELECT 1 FROM memory.sessions s WHERE s.id = session_id));

ALTER TABLE memory_derived.profiles ENABLE ROW LEVEL SECURITY;
CREATE POLICY app_live_lineage ON memory_derived.profiles TO memory_app
    USING (NOT EXISTS (
        SELECT 1 FROM memory_derived.derivations d
        WHERE d.derived_id = id AND lethe.is_erased('session', d.source_session_id::text)));

-- memory_derived.derivations stays readable: it holds identifiers only, and
-- the profiles policy above must see every lineage row to hide a profile.

ALTER TABLE memory_derived.embedding_cache ENABLE ROW LEVEL SECURITY;
CREATE POLICY app_live_content ON memory_derived.embedding_cache TO memory_app
    USING (NOT lethe.is_erased('content', content_sha256));

-- +goose Down
DELETE FROM lethe.lineage_tables WHERE lineage_table = 'memory_derived.derivations'::regclass;
DELETE FROM lethe.content_sources WHERE source_table::text LIKE 'memory.%';
DELETE FROM lethe.content_indexes WHERE index_table = 'memory_derived.embedding_cache'::regclass;
DROP POLICY app_live_content ON memory_derived.embedding_cache;
ALTER TABLE memory_derived.embedding_cache DISABLE ROW LEVEL SECURITY;
DROP POLICY app_live_lineage ON memory_derived.profiles;
ALTER TABLE memory_derived.profiles DISABLE ROW LEVEL SECURITY;
DROP POLICY app_live_session_rows ON memory.backfill_progress;
ALTER TABLE memory.backfill_progress DISABLE ROW LEVEL SECURITY;
-- +goose StatementBegin
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['rounds', 'facts', 'fact_corrections', 'artifacts', 'file_snapshots'] LOOP
        EXECUTE format('DROP POLICY app_live_session_rows ON memory.%I', t);
        EXECUTE format('ALTER TABLE memory.%I DISABLE ROW LEVEL SECURITY', t);
    END LOOP;
END
$$;
-- +goose StatementEnd
DROP POLICY app_live_sessions ON memory.sessions;
ALTER TABLE memory.sessions DISABLE ROW LEVEL SECURITY;
DROP TRIGGER derivations_refuse_erased_lineage ON memory_derived.derivations;
REVOKE ALL ON ALL TABLES IN SCHEMA memory, memory_derived FROM memory_app;
REVOKE ALL ON SCHEMA memory, memory_derived, lethe FROM memory_app;
REVOKE EXECUTE ON FUNCTION lethe.is_erased(text, text) FROM memory_app;
