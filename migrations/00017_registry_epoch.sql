-- The whole registry replaces the catalog epoch (erasure support).
--
-- Migration 00013 made every change to lethe.content_indexes and
-- lethe.lineage_tables replace the token a deletion batch's short way
-- checks, but not changes to lethe.content_sources and lethe.source_columns,
-- which the deletion's layout reads too: a content source registered after
-- a compliant audit left the short way acting on a layout without it, and
-- the ledger without its hashes. Their statement triggers call the same
-- function, enabled ALWAYS. Lethe counts four registry triggers before it
-- trusts the epoch: without this migration every batch takes the long way.

-- +goose Up
CREATE TRIGGER content_sources_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON lethe.content_sources
    FOR EACH STATEMENT EXECUTE FUNCTION lethe.registry_changed();
CREATE TRIGGER source_columns_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON lethe.source_columns
    FOR EACH STATEMENT EXECUTE FUNCTION lethe.registry_changed();
ALTER TABLE lethe.content_sources ENABLE ALWAYS TRIGGER content_sources_changed;
ALTER TABLE lethe.source_columns ENABLE ALWAYS TRIGGER source_columns_changed;

-- +goose Down
DROP TRIGGER source_columns_changed ON lethe.source_columns;
DROP TRIGGER content_sources_changed ON lethe.content_sources;
