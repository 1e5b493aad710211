-- Wires the lineage requirement into the reference schema: a profile with no
-- derivations row at commit fails with SQLSTATE LE003, so no derived record
-- escapes the lineage guard and the deletion by having no lineage.

-- +goose Up
CREATE CONSTRAINT TRIGGER profiles_require_lineage
    AFTER INSERT ON memory_derived.profiles
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION lethe.require_lineage();

-- +goose Down
DROP TRIGGER profiles_require_lineage ON memory_derived.profiles;
