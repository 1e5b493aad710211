-- The layout a request's content ledger was written from (erasure support).
--
-- A tombstone writes the keyed hashes of the sessions' content (scope
-- 'content') and sources (scope 'source') from the layout the deletion knows
-- then: the registered content and source columns in the cascade from
-- sessions. One registered, or a cascading table added, during the grace
-- period is not in it: the deletion would remove that content and its
-- content-keyed entries with no ledger row refusing the content back.
--
--   lethe.erasure_ledger.layout_digest
--                             on a session row, the digest of the layout
--                             (sessions table, the tables cascading from it,
--                             content and source columns, the partitions a
--                             read of theirs reaches) its content and
--                             source rows were written
--                             from; NULL when not known. A deletion batch
--                             takes the short way only when every session's
--                             is the digest of the layout it acts on; the
--                             long way writes the rows again, from its
--                             audited layout, for every session whose is
--                             not. Without this migration every batch takes
--                             the long way and writes them.

-- +goose Up
ALTER TABLE lethe.erasure_ledger ADD COLUMN layout_digest text;

-- +goose Down
ALTER TABLE lethe.erasure_ledger DROP COLUMN layout_digest;
