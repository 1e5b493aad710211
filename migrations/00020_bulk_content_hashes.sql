-- The keyed hashes of many content hashes in one call (erasure support).
--
--   lethe.content_hashes(text[])  each plain hash with its keyed hash
--                                 (SECURITY DEFINER, like lethe.content_hash:
--                                 the key stays readable by nobody else).
--
-- lethe.content_hash reads the key at every call, and a SECURITY DEFINER
-- function is never inlined: hashing n values costs n calls and n reads of
-- the key. This one reads the key once. The deletion's verification uses
-- it to check that the content hashes it read inside its transactions
-- cover every content row the request holds in the ledger; if they do, it
-- looks for what is left by index, with those hashes, instead of hashing
-- every entry of each content index.

-- +goose Up
CREATE FUNCTION lethe.content_hashes(p_shas text[]) RETURNS TABLE (sha text, keyed text)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT s, lethe.content_hmac(s, k.key) FROM unnest(p_shas) s, lethe.erasure_key k WHERE s IS NOT NULL
$$;
REVOKE ALL ON FUNCTION lethe.content_hashes(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lethe.content_hashes(text[]) TO lethe_operator;

-- +goose Down
DROP FUNCTION lethe.content_hashes(text[]);
