-- A deletion's erasure time stays provisional until it is dated after its
-- commit (erasure support).
--
--   lethe.erasure_ledger.erased_at_provisional
--       true: erased_at was set inside the transaction that erased the
--       session (a deletion batch, a re-erasure) and not yet moved past
--       that transaction's commit; NULL: final.
--
-- A batch sets erased_at just before its commit, and a synchronous commit
-- can then wait on a standby while a backup starts and still reads the
-- sessions. So once the batch committed, Lethe moves erased_at to the clock
-- then (later is the safe direction). A manager that died between the two
-- left erased_at early, and nothing told a later pass that the dating was
-- owed: the batch was done, so it was skipped. The batch now marks its rows
-- provisional, the dating clears the mark, and the last step of every
-- deletion pass, and every re-erasure after its commit, dates whatever its
-- request still has provisional.
--
-- Up also marks the datings already lost: session rows last written by the
-- transaction that wrote a Deleted receipt of their request (the batch's own
-- transaction: the dating would have written them again). Down dates what
-- is still provisional before it drops the column, rather than forget it.
--
-- No index may cover the column: the deletion updates it with erased_at,
-- and those updates must stay on the row's page (00019).

-- +goose Up
ALTER TABLE lethe.erasure_ledger ADD COLUMN erased_at_provisional boolean;
COMMENT ON COLUMN lethe.erasure_ledger.erased_at_provisional IS
    'true: erased_at was set inside the erasing transaction and is not yet dated after its commit';
UPDATE lethe.erasure_ledger l SET erased_at_provisional = true
WHERE l.scope = 'session' AND l.erased_at IS NOT NULL
  AND EXISTS (SELECT 1 FROM lethe.erasure_receipts r
              WHERE r.request_uid = l.request_uid AND r.step = 'Deleted' AND r.xmin = l.xmin);

-- +goose Down
UPDATE lethe.erasure_ledger SET erased_at = greatest(erased_at, clock_timestamp())
WHERE erased_at_provisional;
ALTER TABLE lethe.erasure_ledger DROP COLUMN erased_at_provisional;
