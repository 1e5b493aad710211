-- Redacting rows written before the redaction trigger (erasure support).
--
--   lethe.redaction_receipts  one row per batch that changed something:
--                             which column, which pages, how many rows,
--                             how many values per detector (never a value),
--                             when and by whom, written in the batch's
--                             transaction
--   lethe.redact_batch(table, column, first_page, pages, dry_run)
--                             redacts (or, dry, only counts) the column's
--                             values in a range of the table's pages
--                             (TID range scan: bounded work per call) with
--                             lethe.redact_counted, and writes the receipt.
--                             SECURITY DEFINER, so that Lethe's role, which
--                             may not update memory tables, can run it; it
--                             only ever redacts, and only a column the owner
--                             declared redacted (lethe.redacted_columns,
--                             written by lethe.redact_column) that still has
--                             its trigger: never a table a caller made, whose
--                             own triggers would run as the definer.
--
-- kubectl erasure redact walks a table's pages with it in bounded batches.
-- Safe to repeat: redacted text has nothing left to redact.

-- +goose Up
CREATE TABLE lethe.redaction_receipts (
    id           bigserial PRIMARY KEY,
    table_name   text NOT NULL,
    column_name  text NOT NULL,
    first_page   bigint NOT NULL,
    pages        bigint NOT NULL,
    rows_changed bigint NOT NULL,
    counts       jsonb NOT NULL,
    redacted_at  timestamptz NOT NULL DEFAULT now(),
    redacted_by  text NOT NULL DEFAULT session_user
);

-- +goose StatementBegin
CREATE FUNCTION lethe.redact_batch(tbl regclass, col name, first_page bigint, pages bigint, dry_run boolean,
    OUT rows_read bigint, OUT rows_changed bigint, OUT counts jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    range_sql text;
BEGIN
    IF first_page < 0 OR pages < 1 OR pages > 100000 THEN
        RAISE EXCEPTION 'redact_batch: pages % from % out of bounds (1 to 100000 pages)', pages, first_page;
    END IF;
    IF NOT EXISTS (SELECT FROM lethe.redacted_columns r JOIN pg_class c ON c.oid = r.table_oid
                   WHERE r.table_oid = tbl AND r.column_name = col AND c.relpersistence <> 't')
       OR NOT EXISTS (
        SELECT FROM pg_trigger t JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attname = col AND NOT a.attisdropped
        WHERE t.tgrelid = tbl AND t.tgfoid = 'lethe.redact_row'::regproc
          AND col = ANY (string_to_array(rtrim(encode(t.tgargs, 'escape'), '\000'), '\000'))) THEN
        RAISE EXCEPTION 'redact_batch: %.% is not a redacted column (lethe.redact_column) with its trigger', tbl, col
            USING ERRCODE = 'LE005';
    END IF;
    range_sql := format('ctid >= ''(%s,0)''::tid AND ctid < ''(%s,0)''::tid AND %I IS NOT NULL', first_page, first_page + pages, col);
    EXECUTE format('SELECT count(*) FROM %s WHERE %s', tbl, range_sql) INTO rows_read;
    IF dry_run THEN
        EXECUTE format('SELECT count(*) FROM %s t, lethe.redact_counted(t.%I) r WHERE %s AND r.counts <> ''{}''', tbl, col, range_sql) INTO rows_changed;
        EXECUTE format('SELECT coalesce(jsonb_object_agg(key, n), ''{}'') FROM (SELECT key, sum(value::bigint) AS n
            FROM %s t, lethe.redact_counted(t.%I) r, jsonb_each_text(r.counts) WHERE %s GROUP BY key) s', tbl, col, range_sql) INTO counts;
        RETURN;
    END IF;
    EXECUTE format('WITH found AS (
            SELECT t.ctid AS row_id, r.redacted, r.counts FROM %1$s t, lethe.redact_counted(t.%2$I) r
            WHERE %3$s AND r.counts <> ''{}'' FOR UPDATE OF t),
        changed AS (UPDATE %1$s t SET %2$I = found.redacted FROM found WHERE t.ctid = found.row_id RETURNING found.counts)
        SELECT count(*), coalesce((SELECT jsonb_object_agg(key, n) FROM (SELECT key, sum(value::bigint) AS n
            FROM changed, jsonb_each_text(changed.counts) GROUP BY key) s), ''{}'') FROM changed', tbl, col, range_sql)
        INTO rows_changed, counts;
    IF rows_changed > 0 THEN
        INSERT INTO lethe.redaction_receipts (table_name, column_name, first_page, pages, rows_changed, counts)
        VALUES (tbl::text, col, first_page, pages, rows_changed, counts);
    END IF;
END $$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION lethe.redact_batch(regclass, name, bigint, bigint, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lethe.redact_batch(regclass, name, bigint, bigint, boolean) TO lethe_operator;
GRANT SELECT ON lethe.redaction_receipts TO lethe_operator;

-- +goose Down
DROP FUNCTION lethe.redact_batch(regclass, name, bigint, bigint, boolean);
DROP TABLE lethe.redaction_receipts;
