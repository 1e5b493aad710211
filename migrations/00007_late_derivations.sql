-- Late writers lose. A derivation (a compaction job) that read an erased
-- session before its tombstone must not commit a record derived from it
-- after the deletion, and a derived record must carry its lineage.
--
--   lethe.refuse_erased_lineage  now takes a shared transaction-scoped lock
--                                on the source session before it checks the
--                                ledger; Lethe's tombstone takes the same lock
--                                exclusively. A derivation that started first
--                                delays the tombstone until it commits (its
--                                record, with its lineage, is then deleted
--                                with the session); one that comes later waits
--                                for the tombstone and is refused (LE001).
--   lethe.require_lineage        constraint trigger function for derived
--                                tables: at commit, a new derived record with
--                                no lineage row fails with SQLSTATE LE003.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lethe.refuse_erased_lineage() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
DECLARE
    source text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
    IF source IS NULL THEN
        RAISE EXCEPTION 'lineage column "%" missing on %.%', TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME;
    END IF;
    -- Conflicts with the tombstone's exclusive lock on the same session; the
    -- ledger is read after it is granted, by a statement of its own.
    PERFORM pg_advisory_xact_lock_shared(hashtext('lethe.session'), hashtext(source));
    IF lethe.is_erased('session', source) THEN
        RAISE EXCEPTION 'refusing to derive from erased source session %', source
            USING ERRCODE = 'LE001',
                  HINT = 'the source is tombstoned or erased by a Lethe ErasureRequest; drop it from the derivation';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION lethe.require_lineage() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, lethe
AS $$
DECLARE
    lin record;
    found boolean;
BEGIN
    FOR lin IN SELECT lineage_table, derived_column, derived_key FROM lethe.lineage_tables WHERE derived_table = TG_RELID LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE %I::text = $1)', lin.lineage_table, lin.derived_column)
            INTO found USING to_jsonb(NEW) ->> lin.derived_key;
        IF found THEN
            RETURN NULL;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'derived record %.% without lineage', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'LE003',
              HINT = 'write the lineage rows naming its source sessions in the same transaction';
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION lethe.require_lineage();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lethe.refuse_erased_lineage() RETURNS trigger
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
