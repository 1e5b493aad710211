package postgres

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sync"

	"github.com/lethe-dev/lethe/migrations"
)

// redactionMigration creates the redactor's functions; their bodies, as
// that file has them, are what an audit expects in pg_proc.prosrc.
const redactionMigration = "00014_redaction.sql"

// functionBody matches a lethe function's name and its $$-quoted body.
var functionBody = regexp.MustCompile(`(?s)CREATE FUNCTION lethe\.(\w+)\(.*?\bAS \$\$(.*?)\$\$`)

// redactionBodies are the md5 digests of the bodies migration 00014 gives
// its functions, by name, read once from the embedded migration.
var redactionBodies = sync.OnceValues(func() (map[string]string, error) {
	sql, err := migrations.FS.ReadFile(redactionMigration)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range functionBody.FindAllSubmatch(sql, -1) {
		sum := md5.Sum(m[2])
		out[string(m[1])] = hex.EncodeToString(sum[:])
	}
	for _, want := range []string{"redact_row", "redact_text", "redact_counted", "redact_checked", "redaction_check", "redaction_names_pattern"} {
		if _, ok := out[want]; !ok {
			return nil, fmt.Errorf("migration %s has no body for lethe.%s", redactionMigration, want)
		}
	}
	return out, nil
})

// redactionFunctionsSQL is true when every function of schema lethe named
// in $1 exists and each of that name has the body digest at the same place
// in $2 (an overload with another body counts as a difference).
const redactionFunctionsSQL = `SELECT coalesce(bool_and(p.n > 0 AND p.n = p.same), false) FROM unnest($1::text[], $2::text[]) d(name, digest)
	CROSS JOIN LATERAL (SELECT count(*) AS n, count(*) FILTER (WHERE md5(prosrc) = d.digest) AS same
		FROM pg_proc WHERE pronamespace = to_regnamespace('lethe') AND proname = d.name) p`

// redactionFunctionsIntact says whether the redactor's functions in the
// database are migration 00014's: a trigger that calls a replaced
// redact_text redacts nothing, and a sample of clean-looking rows would not
// show it until a value leaked.
func redactionFunctionsIntact(ctx context.Context, q Querier) (bool, error) {
	bodies, err := redactionBodies()
	if err != nil {
		return false, err
	}
	names := slices.Sorted(maps.Keys(bodies))
	digests := make([]string, len(names))
	for i, n := range names {
		digests[i] = bodies[n]
	}
	var ok bool
	if err := q.QueryRow(ctx, redactionFunctionsSQL, names, digests).Scan(&ok); err != nil {
		return false, fmt.Errorf("read the redaction functions: %w", err)
	}
	return ok, nil
}
