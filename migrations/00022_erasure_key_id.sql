-- Which erasure key each keyed ledger row is under (erasure support).
--
--   lethe.erasure_key_id()           'hmac-sha256:' and the first 128 bits of
--                                    the HMAC of a fixed label under
--                                    lethe.erasure_key (SECURITY DEFINER: the
--                                    key stays readable by nobody else; the
--                                    fingerprint does not reveal it)
--   lethe.erasure_ledger.key_id      the fingerprint of the key record_id is
--                                    an HMAC under (scopes 'source' and
--                                    'content'); NULL for sessions
--
-- Every keyed hash in the ledger is an HMAC under lethe.erasure_key. A
-- database given another key keeps those rows but no longer matches them: an
-- erased transcript is ingested again without LE002, and an erased content
-- hash is no longer held erased. A restore with pg_restore --data-only into
-- a freshly migrated database does this (the dump's key collides with the
-- one the migration made, and the migration's stays), as does re-creating
-- the lethe schema. Each row now says its key, and the store's audit counts
-- the requests holding rows under another key than the database's, through
-- the partial index (no row, in a healthy database).
--
-- Up takes the rows already written to be under the key the database has
-- when it runs: the only one it knows.

-- +goose Up
CREATE FUNCTION lethe.erasure_key_id() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT 'hmac-sha256:' || encode(substr(lethe.hmac(convert_to('lethe.dev/erasure-key-id', 'UTF8'), key, 'sha256'), 1, 16), 'hex')
    FROM lethe.erasure_key
$$;
REVOKE ALL ON FUNCTION lethe.erasure_key_id() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lethe.erasure_key_id() TO lethe_operator;

ALTER TABLE lethe.erasure_ledger ADD COLUMN key_id text;
COMMENT ON COLUMN lethe.erasure_ledger.key_id IS
    'lethe.erasure_key_id() of the key record_id is an HMAC under (scopes source and content); NULL for sessions';
UPDATE lethe.erasure_ledger SET key_id = (SELECT lethe.erasure_key_id()) WHERE scope IN ('source', 'content');
CREATE INDEX erasure_ledger_key_id_idx ON lethe.erasure_ledger (key_id) WHERE key_id IS NOT NULL AND cancelled_at IS NULL;

-- +goose Down
DROP INDEX lethe.erasure_ledger_key_id_idx;
ALTER TABLE lethe.erasure_ledger DROP COLUMN key_id;
DROP FUNCTION lethe.erasure_key_id();
