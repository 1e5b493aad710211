-- Hidden from the owner too. Row-level security does not bind a table's
-- owner unless it is FORCEd, and the owner is often the ingester that
-- created the tables: it still read tombstoned sessions with a raw query.
--
--   memory_owner   a NOLOGIN role that owns every table of the reference
--                  schemas (memory, memory_derived). No application connects
--                  as it or as a member of it: an owner may turn row-level
--                  security off again.
--   FORCE ROW LEVEL SECURITY
--                  on every table of those schemas that has it enabled, so
--                  the policies bind the owner like anyone else.
--   the application's policies (00003, 00009) apply to memory_owner too:
--                  a forced owner with no policy of its own would read
--                  nothing, not even the live sessions. It may call the
--                  ledger checks those policies use.
--
-- Lethe's role is unaffected: lethe_operator owns nothing and has its own
-- policies (00004), so it still sees and deletes tombstoned sessions. The
-- cascade of its DELETE runs as the children's owner with forced security
-- lifted (PostgreSQL's referential actions ignore FORCE), so it still
-- reaches every row of an erased session.
--
-- Adopters, for their own memory schema:
--   CREATE ROLE memory_owner NOLOGIN;
--   ALTER TABLE <each memory table> OWNER TO memory_owner;
--   ALTER TABLE <each table with a policy> FORCE ROW LEVEL SECURITY;
-- and give memory_owner the application's policies as below. Schema changes
-- are then made as a member of memory_owner (or a superuser), never by the
-- ingester, which connects as a member of the application role only. A
-- superuser or a BYPASSRLS role still reads everything: give neither to an
-- application. Lethe's audit (SchemaCompliant) names a table whose row-level
-- security is off, not forced or without a policy.
--
-- Run this as a superuser: ALTER ... OWNER TO needs membership in
-- memory_owner, and Lethe's trigger functions (SECURITY DEFINER, owned by
-- the role that ran 00002 and 00007) must still read the lineage tables.
-- Down gives each table back to the owner it had and lifts only the FORCE
-- this migration set; memory_owner stays (roles are shared by every
-- database of the cluster).

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'memory_owner') THEN
        CREATE ROLE memory_owner NOLOGIN;
    END IF;
END
$$;
-- +goose StatementEnd

-- What Down puts back: each table's previous owner, and whether FORCE was
-- set here. Identifiers only (regclass, name), so the residue probes skip it.
CREATE TABLE lethe.memory_owner_undo (
    rel         regclass PRIMARY KEY,
    owner       name     NOT NULL,
    forced_here boolean  NOT NULL
);
REVOKE ALL ON lethe.memory_owner_undo FROM PUBLIC;

INSERT INTO lethe.memory_owner_undo (rel, owner, forced_here)
SELECT c.oid::regclass, pg_get_userbyid(c.relowner), c.relrowsecurity AND NOT c.relforcerowsecurity
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname IN ('memory', 'memory_derived') AND c.relkind IN ('r', 'p');

-- +goose StatementBegin
DO $$
DECLARE u record;
BEGIN
    FOR u IN SELECT rel, forced_here FROM lethe.memory_owner_undo LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO memory_owner', u.rel);
        IF u.forced_here THEN
            EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', u.rel);
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- The application's policies bind the owner too (its live rows stay readable).
-- +goose StatementBegin
DO $$
DECLARE p record;
BEGIN
    FOR p IN SELECT pol.polname, pol.polrelid::regclass AS rel,
                    (SELECT string_agg(quote_ident(r.rolname), ', ') FROM pg_roles r WHERE r.oid = ANY (pol.polroles)) AS roles
             FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname IN ('memory', 'memory_derived')
               AND (SELECT oid FROM pg_roles WHERE rolname = 'memory_app') = ANY (pol.polroles) LOOP
        EXECUTE format('ALTER POLICY %I ON %s TO %s, memory_owner', p.polname, p.rel, p.roles);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- The schemas stay their owner's; memory_owner needs to reach its tables
-- (referential checks and cascades run as the tables' owner).
GRANT USAGE ON SCHEMA memory, memory_derived, lethe TO memory_owner;
GRANT EXECUTE ON FUNCTION lethe.is_erased(text, text), lethe.is_erased_content(text),
    lethe.is_erased_content(text, text), lethe.is_erased_content(text, text[], text) TO memory_owner;

-- +goose Down
REVOKE EXECUTE ON FUNCTION lethe.is_erased(text, text), lethe.is_erased_content(text),
    lethe.is_erased_content(text, text), lethe.is_erased_content(text, text[], text) FROM memory_owner;
REVOKE USAGE ON SCHEMA memory, memory_derived, lethe FROM memory_owner;

-- +goose StatementBegin
DO $$
DECLARE p record;
BEGIN
    FOR p IN SELECT pol.polname, pol.polrelid::regclass AS rel,
                    (SELECT string_agg(quote_ident(r.rolname), ', ') FROM pg_roles r
                     WHERE r.oid = ANY (pol.polroles) AND r.rolname <> 'memory_owner') AS roles
             FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname IN ('memory', 'memory_derived')
               AND (SELECT oid FROM pg_roles WHERE rolname = 'memory_owner') = ANY (pol.polroles)
               AND (SELECT oid FROM pg_roles WHERE rolname = 'memory_app') = ANY (pol.polroles) LOOP
        EXECUTE format('ALTER POLICY %I ON %s TO %s', p.polname, p.rel, p.roles);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE u record;
BEGIN
    FOR u IN SELECT rel, owner, forced_here FROM lethe.memory_owner_undo LOOP
        IF u.forced_here THEN
            EXECUTE format('ALTER TABLE %s NO FORCE ROW LEVEL SECURITY', u.rel);
        END IF;
        EXECUTE format('ALTER TABLE %s OWNER TO %I', u.rel, u.owner);
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP TABLE lethe.memory_owner_undo;
