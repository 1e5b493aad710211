-- The erasure key's fingerprint (erasure support).
--
--   lethe.erasure_key_id()  'hmac-sha256:' and the first 128 bits of the
--                           HMAC of a fixed label under lethe.erasure_key
--                           (SECURITY DEFINER: the key stays readable by
--                           nobody else; the fingerprint does not reveal it)
--
-- Every keyed hash in the ledger (scopes 'source' and 'content') is an HMAC
-- under lethe.erasure_key. A database given another key keeps those rows but
-- no longer matches them: an erased transcript is ingested again without
-- LE002, and an erased content hash is no longer held erased. A restore
-- with pg_restore --data-only into a freshly migrated database does this
-- (the dump's key collides with the one the migration made, and the
-- migration's stays). Lethe records the fingerprint with each erasure in the
-- store's record, in the API server, and the store's audit compares it with
-- this one.

-- +goose Up
CREATE FUNCTION lethe.erasure_key_id() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT 'hmac-sha256:' || encode(substr(lethe.hmac(convert_to('lethe.dev/erasure-key-id', 'UTF8'), key, 'sha256'), 1, 16), 'hex')
    FROM lethe.erasure_key
$$;
REVOKE ALL ON FUNCTION lethe.erasure_key_id() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lethe.erasure_key_id() TO lethe_operator;

-- +goose Down
DROP FUNCTION lethe.erasure_key_id();
