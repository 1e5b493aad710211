-- The layout a request's content ledger was written under (erasure support).
--
-- A tombstone writes the keyed hashes of the sessions' content (scope
-- 'content') from the layout the deletion knows then: the content sources
-- and cascading tables of the registry and the catalog. A content source
-- registered, or a cascading table added, during the grace period is not in
-- it: the deletion would then remove that content and its content-keyed
-- entries with no ledger row refusing the content back.
--
--   lethe.erasure_ledger.layout_epoch
--                             on a session row, md5 of the catalog epoch
--                             (migration 00013) its content rows were
--                             written under, NULL when not known. A
--                             deletion batch takes the short way only when
--                             every session's is the epoch it runs under;
--                             the long way writes the content rows again,
--                             from its audited layout, for every session
--                             whose is not. Without this migration every
--                             batch takes the long way and writes them.

-- +goose Up
ALTER TABLE lethe.erasure_ledger ADD COLUMN layout_epoch text;

-- +goose Down
ALTER TABLE lethe.erasure_ledger DROP COLUMN layout_epoch;
