-- Keyed content hashes. Until now the ledger's 'content' rows held the
-- application's plain sha256 of erased content: a permanent list of erased
-- texts that anyone holding a candidate text (or a dictionary of them) could
-- check. They now hold HMAC(lethe.erasure_key, content_sha256), like the
-- source rows (00005), and the checks hash before they look.
--
-- Erasure support (any memory database):
--
--   lethe.content_hash(text)     the keyed hash (SECURITY DEFINER: the key stays
--                                readable by nobody else). Existing content rows
--                                are rewritten with it.
--   lethe.is_erased('content', sha)
--                                now hashes sha first, so policies written
--                                against 00003 keep hiding erased content.
--   lethe.is_erased_content      the checks for policies on content-keyed tables:
--     (sha)                        erased for any tenant;
--     (sha, tenant)                erased for that tenant (a table with one row
--                                  per tenant and content);
--     (sha, tenants[], reader)     the rule for a row shared by the tenants
--                                  listed on it (below).
--   lethe.content_indexes.tenant_column
--                                optional: the column (text[] or text) of a
--                                content-keyed table that records the tenants
--                                using a row. For a text[] column, grant
--                                lethe_operator UPDATE of it.
--
-- Tenants. A content row of the ledger records, in tenant_id, the tenant of
-- the MemoryStore that erased it (spec.tenantID); NULL (a store without a
-- tenant) means every tenant, as before. When the content index records
-- tenants, Lethe's deletion removes only the erasing tenant from a row and
-- deletes the row once no tenant is left on it (a row listing no tenant, or an
-- erasure for every tenant, deletes it outright, as before). Another tenant's
-- identical text stays.
--
-- The rule for a shared row (lethe.is_erased_content(sha, tenants, reader)):
-- with E the tenants whose erasure of the content is in force,
--   * never erased: visible;
--   * erased for every tenant (a NULL in E): hidden;
--   * the reader (the application's own tenant, when it says so) is in E: hidden;
--   * the row lists no tenant: hidden;
--   * the reader is unknown: hidden when any listed tenant is in E — the reader
--     may be that tenant, and the row still serves its erased use until the
--     deletion removes it from the list;
--   * the reader is known and not in E: hidden only when every listed tenant is
--     in E (nobody who may still use the content holds the row).
-- NULL elements of a tenant list are ignored.
--
-- Reference wiring (schema memory_derived): embedding_cache gets tenant_ids
-- (filled from the sessions that use each entry), registered as its tenant
-- column, and its policy reads the reader from the setting memory.tenant_id
-- (SET memory.tenant_id = '...' in the application's session or transaction;
-- unset or empty: unknown reader).
--
-- Down cannot turn keyed hashes back into plain ones: it keeps them, marked
-- 'hmac-sha256:', and lethe.is_erased('content', ...) keeps matching them, so a
-- downgrade lifts no erasure. Up again takes the mark off.

-- +goose Up
ALTER TABLE lethe.content_indexes ADD COLUMN tenant_column name;

-- content_hmac is the hash itself, given the key. Inlined into the checks
-- below, it saves a second SECURITY DEFINER call per row a policy checks
-- (each such call costs about as much as the whole check). Useless without
-- the key, which only the definer functions read.
CREATE FUNCTION lethe.content_hmac(p_sha text, p_key bytea) RETURNS text
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT encode(lethe.hmac(convert_to(p_sha, 'UTF8'), p_key, 'sha256'), 'hex')
$$;
REVOKE ALL ON FUNCTION lethe.content_hmac(text, bytea) FROM PUBLIC;

CREATE FUNCTION lethe.content_hash(p_sha text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT lethe.content_hmac(p_sha, key) FROM lethe.erasure_key
$$;
REVOKE ALL ON FUNCTION lethe.content_hash(text) FROM PUBLIC;

-- Rows a Down kept keyed lose their mark; every other row is a plain hash.
UPDATE lethe.erasure_ledger
SET record_id = CASE WHEN record_id LIKE 'hmac-sha256:%' THEN substr(record_id, 13) ELSE lethe.content_hash(record_id) END
WHERE scope = 'content';

CREATE OR REPLACE FUNCTION lethe.is_erased(p_scope text, p_record_id text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT EXISTS (
        SELECT 1 FROM lethe.erasure_ledger
        WHERE scope = p_scope AND cancelled_at IS NULL
          AND record_id = CASE WHEN p_scope = 'content'
              THEN (SELECT lethe.content_hmac(p_record_id, key) FROM lethe.erasure_key) ELSE p_record_id END
    )
$$;

CREATE FUNCTION lethe.is_erased_content(p_sha text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT EXISTS (
        SELECT 1 FROM lethe.erasure_ledger
        WHERE scope = 'content' AND cancelled_at IS NULL
          AND record_id = (SELECT lethe.content_hmac(p_sha, key) FROM lethe.erasure_key)
    )
$$;
REVOKE ALL ON FUNCTION lethe.is_erased_content(text) FROM PUBLIC;

-- A NULL tenant asks about any tenant.
CREATE FUNCTION lethe.is_erased_content(p_sha text, p_tenant text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT EXISTS (
        SELECT 1 FROM lethe.erasure_ledger
        WHERE scope = 'content' AND cancelled_at IS NULL
          AND record_id = (SELECT lethe.content_hmac(p_sha, key) FROM lethe.erasure_key)
          AND (p_tenant IS NULL OR tenant_id IS NULL OR tenant_id = p_tenant)
    )
$$;
REVOKE ALL ON FUNCTION lethe.is_erased_content(text, text) FROM PUBLIC;

-- The rule for a shared row (see the header). E is erasers; a NULL
-- condition (an unknown reader) falls through to the next case.
CREATE FUNCTION lethe.is_erased_content(p_sha text, p_tenants text[], p_reader text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT CASE
        WHEN e.erasers IS NULL THEN false
        WHEN e.everyone OR p_reader = ANY(e.erasers) OR cardinality(t.listed) = 0 THEN true
        WHEN p_reader IS NULL THEN t.listed && e.erasers
        ELSE t.listed <@ e.erasers
    END
    FROM (SELECT array_agg(DISTINCT tenant_id) AS erasers, bool_or(tenant_id IS NULL) AS everyone
          FROM lethe.erasure_ledger
          WHERE scope = 'content' AND cancelled_at IS NULL
            AND record_id = (SELECT lethe.content_hmac(p_sha, key) FROM lethe.erasure_key)) e,
         (SELECT coalesce(array_remove(p_tenants, NULL), '{}') AS listed) t
$$;
REVOKE ALL ON FUNCTION lethe.is_erased_content(text, text[], text) FROM PUBLIC;

-- Lethe writes and verifies the keyed hashes, and its residue probe asks
-- which shared rows are still hidden by an erasure.
GRANT EXECUTE ON FUNCTION lethe.content_hash(text) TO lethe_operator;
GRANT EXECUTE ON FUNCTION lethe.is_erased_content(text), lethe.is_erased_content(text, text[], text) TO lethe_operator;

-- Reference wiring.
ALTER TABLE memory_derived.embedding_cache ADD COLUMN tenant_ids text[];
COMMENT ON COLUMN memory_derived.embedding_cache.tenant_ids IS
    'tenants whose sessions use this entry; the application adds its tenant when it uses the entry';

-- Each entry is used by the tenants of the sessions holding its hash
-- (tombstoned ones too: they hold it until their deletion). An entry no
-- session names keeps NULL: it lists no tenant.
UPDATE memory_derived.embedding_cache c SET tenant_ids = u.tenants
FROM (
    SELECT h, array_agg(DISTINCT tenant_id ORDER BY tenant_id) AS tenants FROM (
        SELECT summary_sha256, tenant_id FROM memory.sessions
        UNION ALL SELECT r.content_sha256, s.tenant_id FROM memory.rounds r JOIN memory.sessions s ON s.id = r.session_id
        UNION ALL SELECT f.content_sha256, s.tenant_id FROM memory.facts f JOIN memory.sessions s ON s.id = f.session_id
        UNION ALL SELECT fs.content_sha256, s.tenant_id FROM memory.file_snapshots fs JOIN memory.sessions s ON s.id = fs.session_id
    ) x(h, tenant_id)
    WHERE h IS NOT NULL AND tenant_id IS NOT NULL
    GROUP BY h
) u
WHERE c.content_sha256 = u.h;

UPDATE lethe.content_indexes SET tenant_column = 'tenant_ids'
WHERE index_table = 'memory_derived.embedding_cache'::regclass;
-- Lethe takes the erasing tenant off a shared entry: the one column it may change.
GRANT UPDATE (tenant_ids) ON memory_derived.embedding_cache TO lethe_operator;

GRANT EXECUTE ON FUNCTION lethe.is_erased_content(text), lethe.is_erased_content(text, text),
    lethe.is_erased_content(text, text[], text) TO memory_app;

DROP POLICY app_live_content ON memory_derived.embedding_cache;
CREATE POLICY app_live_content ON memory_derived.embedding_cache TO memory_app
    USING (NOT lethe.is_erased_content(content_sha256, tenant_ids, nullif(current_setting('memory.tenant_id', true), '')));

-- +goose Down
DROP POLICY app_live_content ON memory_derived.embedding_cache;
CREATE POLICY app_live_content ON memory_derived.embedding_cache TO memory_app
    USING (NOT lethe.is_erased('content', content_sha256));
ALTER TABLE memory_derived.embedding_cache DROP COLUMN tenant_ids;

UPDATE lethe.erasure_ledger SET record_id = 'hmac-sha256:' || record_id WHERE scope = 'content';

-- A content record matches its plain hash (written from now on) or its
-- kept keyed hash.
CREATE OR REPLACE FUNCTION lethe.is_erased(p_scope text, p_record_id text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
    SELECT EXISTS (
        SELECT 1 FROM lethe.erasure_ledger
        WHERE scope = p_scope AND cancelled_at IS NULL
          AND record_id = ANY (ARRAY[p_record_id, CASE WHEN p_scope = 'content' THEN (
              SELECT 'hmac-sha256:' || encode(lethe.hmac(convert_to(p_record_id, 'UTF8'), key, 'sha256'), 'hex')
              FROM lethe.erasure_key) END])
    )
$$;

DROP FUNCTION lethe.is_erased_content(text, text[], text);
DROP FUNCTION lethe.is_erased_content(text, text);
DROP FUNCTION lethe.is_erased_content(text);
DROP FUNCTION lethe.content_hash(text);
DROP FUNCTION lethe.content_hmac(text, bytea);
ALTER TABLE lethe.content_indexes DROP COLUMN tenant_column;
