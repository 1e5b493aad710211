-- Room on the ledger's pages for the deletion's updates (erasure support).
--
-- A deletion batch updates each session's ledger row twice: erased_at in
-- the batch, then again once the batch committed (later is the safe
-- direction). No index covers erased_at, so each update can stay on the
-- row's page (a heap-only tuple: no new entry in the primary key or in
-- erasure_ledger_active_idx) when the page has room for it. A tombstone
-- filled every page it wrote: nine updates in ten moved the row to another
-- page and added an entry to both indexes.
--
-- The first update needs room for a version of the row a timestamp
-- longer; the second for one more, once the first's old version is pruned:
-- pages filled to 45% leave that room with a margin for the line pointers
-- pruning keeps. Pruning waits for every snapshot older than the batch's
-- commit (a long transaction or a dump running in the database, a replica's
-- hot_standby_feedback): while one is held, the second update moves the row
-- as before. No index may cover erased_at, in a column, an expression or a
-- predicate: it would make every update add index entries again.
--
-- The setting applies to the pages written after it (a VACUUM FULL
-- rewrites the others); the ledger takes about 2.2 times the pages
-- (100/45), its content rows, which no deletion updates, included.

-- +goose Up
ALTER TABLE lethe.erasure_ledger SET (fillfactor = 45);

-- +goose Down
ALTER TABLE lethe.erasure_ledger RESET (fillfactor);
