-- A deletion batch in one round trip (erasure support, any memory database).
--
-- Lethe's deletion audits the schema inside every batch's transaction (a
-- table added without a cascading key, a guard dropped: it refuses). The
-- audit reads the catalog with ten queries, which cost about as much as
-- the deletion itself. This migration lets a batch skip it while nothing
-- the audit reads has changed since the last audit found it compliant:
--
--   lethe.catalog_epoch       one row, a random token replaced by every DDL
--                             command in the database (an event trigger)
--                             and every change to Lethe's registry tables
--                             (statement triggers), all enabled ALWAYS so
--                             that they fire in every session_replication_role.
--   lethe.require_batch(epoch_unchanged, all_eligible)
--                             raises SQLSTATE LE004 unless both are true.
--                             A batch's first statement locks its sessions
--                             and calls it: the token, with the identity
--                             (oid, row version) of the triggers, functions
--                             and tables that replace it (a disable,
--                             re-enable, replacement or re-create changes
--                             it), must be the one read around the last
--                             compliant audit, and every session of the
--                             batch eligible. Else the pipeline aborts
--                             before any delete and the batch runs the long
--                             way, with the full audit.
--
-- CREATE EVENT TRIGGER needs a superuser. Where the migration runs without
-- one it creates everything else and says so (NOTICE): with no enabled event
-- trigger, require_batch always raises and every batch takes the long way.
-- Not seen by the event trigger (state it to whoever holds superuser): DDL
-- in single-user mode, and direct writes to the system catalogs. Objects
-- dropped with no DDL command (a permanent table's column, constraint,
-- trigger or policy that depends on a temporary object goes when its
-- session ends or runs DISCARD TEMP) are not seen either: Lethe takes the
-- short way only while no such dependency exists.

-- +goose Up
CREATE TABLE lethe.catalog_epoch (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),
    token uuid NOT NULL
);
INSERT INTO lethe.catalog_epoch (token) VALUES (gen_random_uuid());
REVOKE ALL ON lethe.catalog_epoch FROM PUBLIC;
GRANT SELECT ON lethe.catalog_epoch TO lethe_operator;

-- +goose StatementBegin
CREATE FUNCTION lethe.bump_catalog_epoch() RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$ UPDATE lethe.catalog_epoch SET token = gen_random_uuid() $$;
-- +goose StatementEnd

-- Temporary objects cannot break the erasure rules: creating them does not
-- bump the token (an application's temporary tables would otherwise make
-- every DDL wait on the token's row).
-- +goose StatementBegin
CREATE FUNCTION lethe.catalog_changed() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() c WHERE c.schema_name IS NULL OR c.schema_name NOT LIKE 'pg\_temp%')
       OR NOT EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands()) THEN
        PERFORM lethe.bump_catalog_epoch();
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION lethe.registry_changed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
BEGIN
    PERFORM lethe.bump_catalog_epoch();
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER content_indexes_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON lethe.content_indexes
    FOR EACH STATEMENT EXECUTE FUNCTION lethe.registry_changed();
CREATE TRIGGER lineage_tables_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON lethe.lineage_tables
    FOR EACH STATEMENT EXECUTE FUNCTION lethe.registry_changed();
ALTER TABLE lethe.content_indexes ENABLE ALWAYS TRIGGER content_indexes_changed;
ALTER TABLE lethe.lineage_tables ENABLE ALWAYS TRIGGER lineage_tables_changed;

-- +goose StatementBegin
DO $$
BEGIN
    CREATE EVENT TRIGGER lethe_catalog_changed ON ddl_command_end EXECUTE FUNCTION lethe.catalog_changed();
    ALTER EVENT TRIGGER lethe_catalog_changed ENABLE ALWAYS;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'lethe: no event trigger (CREATE EVENT TRIGGER needs a superuser): every deletion batch takes the long way';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION lethe.require_batch(epoch_unchanged boolean, all_eligible boolean) RETURNS boolean
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    IF epoch_unchanged IS NOT TRUE THEN
        RAISE EXCEPTION 'the catalog may have changed since the deletion''s last schema audit' USING ERRCODE = 'LE004';
    END IF;
    IF all_eligible IS NOT TRUE THEN
        RAISE EXCEPTION 'not every session of the batch is eligible' USING ERRCODE = 'LE004';
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION lethe.require_batch(boolean, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lethe.require_batch(boolean, boolean) TO lethe_operator;

-- +goose Down
DROP FUNCTION lethe.require_batch(boolean, boolean);
DROP EVENT TRIGGER IF EXISTS lethe_catalog_changed;
DROP TRIGGER lineage_tables_changed ON lethe.lineage_tables;
DROP TRIGGER content_indexes_changed ON lethe.content_indexes;
DROP FUNCTION lethe.registry_changed();
DROP FUNCTION lethe.catalog_changed();
DROP FUNCTION lethe.bump_catalog_epoch();
DROP TABLE lethe.catalog_epoch;
