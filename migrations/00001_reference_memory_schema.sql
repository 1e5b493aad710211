-- The reference memory schema of the decision record (ADR-043): seven tables in
-- schema "memory", every child cascading from memory.sessions, every foreign
-- key indexed, HNSW indexes on the embedding columns. Tests, benchmarks and the
-- demo run against it.
--
-- The residue classes of the invariants note live beside it in schema
-- "memory_derived": a content-keyed embedding cache (no foreign key to
-- sessions) and derived profiles with a lineage table. They sit outside
-- "memory" on purpose: the decision record's validation query 3 expects
-- exactly its seven tables there.

-- +goose Up
CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA IF NOT EXISTS memory;

CREATE TABLE memory.sessions (
    id                uuid PRIMARY KEY,
    tenant_id         text        NOT NULL DEFAULT 'default',
    source_path       text,
    started_at        timestamptz,
    ended_at          timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    summary           text,
    -- sha256 (hex) of the text the embedding was computed from: the key of
    -- memory_derived.embedding_cache.
    summary_sha256    text,
    summary_embedding vector(384),
    tombstoned_at     timestamptz,
    tombstoned_by     text,
    CHECK ((tombstoned_at IS NULL) = (tombstoned_by IS NULL))
);
CREATE INDEX sessions_tenant_idx ON memory.sessions (tenant_id);
CREATE INDEX sessions_tombstoned_idx ON memory.sessions (tombstoned_at) WHERE tombstoned_at IS NOT NULL;
CREATE INDEX sessions_summary_embedding_hnsw ON memory.sessions USING hnsw (summary_embedding vector_cosine_ops);

CREATE TABLE memory.rounds (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id         uuid   NOT NULL REFERENCES memory.sessions (id) ON DELETE CASCADE,
    round_index        integer NOT NULL,
    user_text          text,
    assistant_text     text,
    tool_calls         jsonb,
    -- redacted at insert by the ingester; audit only.
    assistant_thinking text,
    content_sha256     text,
    embedding          vector(384),
    created_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, round_index)
);
CREATE INDEX rounds_content_sha256_idx ON memory.rounds (content_sha256);
CREATE INDEX rounds_embedding_hnsw ON memory.rounds USING hnsw (embedding vector_cosine_ops);

CREATE TABLE memory.facts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id     uuid   NOT NULL REFERENCES memory.sessions (id) ON DELETE CASCADE,
    round_id       bigint REFERENCES memory.rounds (id) ON DELETE CASCADE,
    kind           text   NOT NULL CHECK (kind IN ('decision', 'problem', 'learning')),
    content        text   NOT NULL,
    reasoning      text,
    content_sha256 text,
    embedding      vector(384),
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX facts_session_id_idx ON memory.facts (session_id);
CREATE INDEX facts_round_id_idx ON memory.facts (round_id);
CREATE INDEX facts_content_sha256_idx ON memory.facts (content_sha256);
CREATE INDEX facts_embedding_hnsw ON memory.facts USING hnsw (embedding vector_cosine_ops);

CREATE TABLE memory.fact_corrections (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fact_id    bigint NOT NULL REFERENCES memory.facts (id) ON DELETE CASCADE,
    session_id uuid   NOT NULL REFERENCES memory.sessions (id) ON DELETE CASCADE,
    correction text   NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX fact_corrections_fact_id_idx ON memory.fact_corrections (fact_id);
CREATE INDEX fact_corrections_session_id_idx ON memory.fact_corrections (session_id);

CREATE TABLE memory.artifacts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id   uuid NOT NULL REFERENCES memory.sessions (id) ON DELETE CASCADE,
    kind         text NOT NULL CHECK (kind IN ('commit', 'document', 'issue', 'manifest')),
    artifact_ref text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX artifacts_session_id_idx ON memory.artifacts (session_id);

CREATE TABLE memory.file_snapshots (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id     uuid NOT NULL REFERENCES memory.sessions (id) ON DELETE CASCADE,
    path           text NOT NULL,
    content        text,
    content_sha256 text,
    captured_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX file_snapshots_session_id_idx ON memory.file_snapshots (session_id);

-- Ingestion progress per transcript file; names a session once the file has one.
CREATE TABLE memory.backfill_progress (
    source_path text PRIMARY KEY,
    session_id  uuid REFERENCES memory.sessions (id) ON DELETE CASCADE,
    bytes_read  bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX backfill_progress_session_id_idx ON memory.backfill_progress (session_id);

-- Residue classes (see the header).
CREATE SCHEMA IF NOT EXISTS memory_derived;

-- Content-keyed: identical texts share one entry, and no foreign key reaches
-- sessions, so a cascade never removes it.
CREATE TABLE memory_derived.embedding_cache (
    content_sha256 text PRIMARY KEY,
    text           text NOT NULL,
    embedding      vector(384) NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX embedding_cache_embedding_hnsw ON memory_derived.embedding_cache USING hnsw (embedding vector_cosine_ops);

-- Derived across scopes: a profile summarises several sessions.
CREATE TABLE memory_derived.profiles (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id  text NOT NULL DEFAULT 'default',
    kind       text NOT NULL,
    summary    text NOT NULL,
    embedding  vector(384),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX profiles_tenant_idx ON memory_derived.profiles (tenant_id);

-- Lineage: deliberately no foreign key to sessions, so the lineage outlives a
-- cascade and tells Lethe which derived records to remove.
CREATE TABLE memory_derived.derivations (
    derived_id        bigint NOT NULL REFERENCES memory_derived.profiles (id) ON DELETE CASCADE,
    source_session_id uuid   NOT NULL,
    PRIMARY KEY (derived_id, source_session_id)
);
CREATE INDEX derivations_source_session_idx ON memory_derived.derivations (source_session_id);

-- +goose Down
DROP SCHEMA memory_derived CASCADE;
DROP SCHEMA memory CASCADE;
