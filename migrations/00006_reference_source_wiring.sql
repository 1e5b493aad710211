-- Wires erased sources into the reference memory schema: the source
-- identifier of a session is memory.sessions.source_path (the transcript
-- file); inserting a session from an erased source, or pointing one at it,
-- fails with SQLSTATE LE002. Lethe's role may compute the keyed hash and read
-- the registry; nobody may release a source until the DBA grants
-- lethe.release_source(text) (see the README).

-- +goose Up
INSERT INTO lethe.source_columns (source_table, source_column) VALUES ('memory.sessions', 'source_path');

CREATE TRIGGER sessions_refuse_erased_source
    BEFORE INSERT OR UPDATE OF source_path ON memory.sessions
    FOR EACH ROW EXECUTE FUNCTION lethe.refuse_erased_source('source_path');

GRANT EXECUTE ON FUNCTION lethe.source_hash(text) TO lethe_operator;
GRANT SELECT ON lethe.source_columns TO lethe_operator;

-- +goose Down
REVOKE SELECT ON lethe.source_columns FROM lethe_operator;
REVOKE EXECUTE ON FUNCTION lethe.source_hash(text) FROM lethe_operator;
DROP TRIGGER sessions_refuse_erased_source ON memory.sessions;
DELETE FROM lethe.source_columns WHERE source_table = 'memory.sessions'::regclass;
