-- The database role Lethe's manager runs as (S3, least privilege): only what
-- its steps need, and row-level security lifted only where the design needs
-- it — Lethe must see tombstoned sessions, the rows under them, their
-- derived records and cache entries, which the application role cannot.
-- Grant it to the login role of the manager's DSN:
--   CREATE ROLE lethe LOGIN PASSWORD '...' IN ROLE lethe_operator;
--
--   memory.sessions                    SELECT; UPDATE of the tombstone columns; DELETE (the cascade runs as the tables' owner)
--   memory.* (the cascading tables)    SELECT (plan counts, verification, residue probe)
--   memory_derived.*                   SELECT, DELETE (content-keyed entries, derived records and their lineage)
--   lethe.erasure_ledger               SELECT, INSERT, UPDATE (tombstone, erase, cancel marks)
--   lethe.erasure_receipts             SELECT, INSERT — never UPDATE or DELETE: receipts are append-only
--   lethe.content_* / lineage_tables   SELECT (the registry)
-- No CREATE, no DROP, no TRUNCATE, no INSERT into the memory, no other column updated.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lethe_operator') THEN
        CREATE ROLE lethe_operator NOLOGIN;
    END IF;
END
$$;
-- +goose StatementEnd

GRANT USAGE ON SCHEMA memory, memory_derived, lethe TO lethe_operator;
GRANT SELECT ON ALL TABLES IN SCHEMA memory TO lethe_operator;
GRANT UPDATE (tombstoned_at, tombstoned_by), DELETE ON memory.sessions TO lethe_operator;
GRANT SELECT, DELETE ON ALL TABLES IN SCHEMA memory_derived TO lethe_operator;
GRANT SELECT, INSERT, UPDATE ON lethe.erasure_ledger TO lethe_operator;
GRANT SELECT, INSERT ON lethe.erasure_receipts TO lethe_operator;
GRANT SELECT ON lethe.content_indexes, lethe.content_sources, lethe.lineage_tables TO lethe_operator;
GRANT EXECUTE ON FUNCTION lethe.is_erased(text, text) TO lethe_operator;

-- Row-level security: every table with a policy for the application role
-- gets one letting lethe_operator see and change every row.
-- +goose StatementBegin
DO $$
DECLARE t regclass;
BEGIN
    FOR t IN SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relrowsecurity AND n.nspname IN ('memory', 'memory_derived') LOOP
        EXECUTE format('CREATE POLICY lethe_operator_all ON %s TO lethe_operator USING (true) WITH CHECK (true)', t);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE t regclass;
BEGIN
    FOR t IN SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_policy p ON p.polrelid = c.oid AND p.polname = 'lethe_operator_all'
             WHERE n.nspname IN ('memory', 'memory_derived') LOOP
        EXECUTE format('DROP POLICY lethe_operator_all ON %s', t);
    END LOOP;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON ALL TABLES IN SCHEMA memory, memory_derived FROM lethe_operator;
REVOKE ALL ON lethe.erasure_ledger, lethe.erasure_receipts, lethe.content_indexes, lethe.content_sources, lethe.lineage_tables FROM lethe_operator;
REVOKE EXECUTE ON FUNCTION lethe.is_erased(text, text) FROM lethe_operator;
REVOKE USAGE ON SCHEMA memory, memory_derived, lethe FROM lethe_operator;
