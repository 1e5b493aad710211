-- A deletion's erasure time stays provisional until it is dated after its
-- commit (erasure support).
--
--   lethe.erasure_ledger.erased_at_provisional
--       true: erased_at was set inside the deletion batch's transaction and
--       not yet moved past that transaction's commit; NULL: final.
--
-- A batch sets erased_at just before its commit, and a synchronous commit
-- can then wait on a standby while a backup starts and still reads the
-- sessions. So once the batch committed, Lethe moves erased_at to the clock
-- then (later is the safe direction). A manager that died between the two
-- left erased_at early, and nothing told a later pass that the dating was
-- owed: the batch was done, so it was skipped. The batch now marks its rows
-- provisional, the dating clears the mark, and the last step of every
-- deletion pass dates whatever its request still has provisional.
--
-- No index may cover the column: the deletion updates it with erased_at,
-- and those updates must stay on the row's page (00019).

-- +goose Up
ALTER TABLE lethe.erasure_ledger ADD COLUMN erased_at_provisional boolean;
COMMENT ON COLUMN lethe.erasure_ledger.erased_at_provisional IS
    'true: erased_at was set inside the deletion''s transaction and is not yet dated after its commit';

-- +goose Down
ALTER TABLE lethe.erasure_ledger DROP COLUMN erased_at_provisional;
