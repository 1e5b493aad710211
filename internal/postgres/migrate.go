package postgres

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/lethe-dev/lethe/migrations"
)

// MigrationTable is goose's version table. It lives in public so that it
// exists before the first migration creates the lethe schema.
const MigrationTable = "lethe_goose_db_version"

// MigrateResult reports what Migrate did.
type MigrateResult struct {
	Applied []int64
	Version int64
}

// Migrate applies every pending embedded migration to dsn. A session-level
// advisory lock keeps two concurrent runs from racing. Lethe's manager never
// calls this on its own: applying migrations is an explicit command.
func Migrate(ctx context.Context, dsn string) (MigrateResult, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return MigrateResult{}, fmt.Errorf("invalid postgres DSN: it must be a URL or key=value string that pgx can parse")
	}
	db := stdlib.OpenDB(*cfg)
	defer func() { _ = db.Close() }()
	return migrateDB(ctx, db)
}

func migrateDB(ctx context.Context, db *sql.DB) (MigrateResult, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return MigrateResult{}, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(MigrationTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return MigrateResult{}, fmt.Errorf("load migrations: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return MigrateResult{}, fmt.Errorf("apply migrations: %w", err)
	}
	var out MigrateResult
	for _, r := range results {
		out.Applied = append(out.Applied, r.Source.Version)
	}
	out.Version, err = p.GetDBVersion(ctx)
	if err != nil {
		return out, fmt.Errorf("read migration version: %w", err)
	}
	return out, nil
}
