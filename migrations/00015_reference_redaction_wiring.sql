-- The reference schema's reasoning column is redacted at insert
-- (decision 6 of the memory system's erasure decision record): the
-- trigger of 00014 on memory.rounds.assistant_thinking, enabled ALWAYS so
-- that no session_replication_role skips it. An adopter's own columns are
-- wired the same way: SELECT lethe.redact_column('schema.table', 'column').

-- +goose Up
SELECT lethe.redact_column('memory.rounds', 'assistant_thinking');

-- +goose Down
DROP TRIGGER IF EXISTS lethe_redact_assistant_thinking ON memory.rounds;
DELETE FROM lethe.redacted_columns WHERE table_oid = 'memory.rounds'::regclass AND column_name = 'assistant_thinking';
