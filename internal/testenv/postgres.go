package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/postgres"
)

// Postgres is a throw-away PostgreSQL cluster on a loopback port.
type Postgres struct {
	// Port the server listens on (127.0.0.1 only).
	Port int
	// Dir holds the data folder and the unix socket.
	Dir  string
	proc *process
	bin  string
	cred *syscall.Credential

	mu       sync.Mutex
	template string
	seq      atomic.Int64
}

// PostgresBin is where initdb and postgres are looked for ($LETHE_PG_BIN).
func PostgresBin() string { return envOr("LETHE_PG_BIN", "/usr/lib/postgresql/15/bin") }

// StartPostgres initialises a cluster in a temp folder and starts it. As root
// (CI), initdb and postgres run as the postgres system user, since both refuse
// to run as root.
func StartPostgres() (*Postgres, error) {
	bin := PostgresBin()
	for _, b := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, missing("PostgreSQL "+b, filepath.Join(bin, b), "postgres")
		}
	}
	if err := checkPgvector(bin); err != nil {
		return nil, err
	}
	return startCluster(bin, "lethe-pg-", func(data string, cred *syscall.Credential) error {
		initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync")
		initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := initdb.CombinedOutput(); err != nil {
			return fmt.Errorf("initdb: %w\n%s", err, out)
		}
		return nil
	})
}

// startCluster makes a temp folder owned by the server's user, fills its
// data folder with create, and starts a server on a free loopback port.
func startCluster(bin, prefix string, create func(data string, cred *syscall.Credential) error) (*Postgres, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	cred, err := postgresCredential(dir)
	if err == nil {
		err = create(filepath.Join(dir, "data"), cred)
	}
	var port int
	if err == nil {
		port, err = FreePort()
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	pg := &Postgres{Port: port, Dir: dir, bin: bin, cred: cred}
	if err := pg.StartServer(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return pg, nil
}

// StartServer (re)starts the server on the same port and data folder.
func (p *Postgres) StartServer() error {
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), "-D", filepath.Join(p.Dir, "data"), "-p", itoa(p.Port), "-k", p.Dir,
		"-c", "listen_addresses=127.0.0.1",
		// Speed over durability: the cluster is thrown away after the tests.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "wal_level=replica", "-c", "max_wal_senders=4", "-c", "max_connections=200",
		"-c", "autovacuum=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	// SIGQUIT is PostgreSQL's immediate shutdown, should the test binary die.
	proc, err := start("postgres", cmd, syscall.SIGQUIT)
	if err != nil {
		return err
	}
	p.proc = proc
	err = proc.waitFor(30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, p.DSN("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
	if err != nil {
		p.proc.stop(syscall.SIGINT, 20*time.Second)
		return err
	}
	return nil
}

// ServerLog is what the server has written to its log (stderr) since it
// last started.
func (p *Postgres) ServerLog() string { return p.proc.log.String() }

// StopServer shuts the server down (fast shutdown, by PID), keeping its data:
// an outage that StartServer ends.
func (p *Postgres) StopServer() {
	p.proc.stop(syscall.SIGINT, 20*time.Second)
}

// checkPgvector fails with the install command when vector.control is missing.
func checkPgvector(bin string) error {
	out, err := exec.Command(filepath.Join(bin, "pg_config"), "--sharedir").Output()
	if err != nil {
		return missing("pg_config", filepath.Join(bin, "pg_config"), "postgres")
	}
	control := filepath.Join(string(trimNL(out)), "extension", "vector.control")
	if _, err := os.Stat(control); err != nil {
		return missing("the pgvector extension", control, "postgres")
	}
	return nil
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// postgresCredential returns the postgres user's credential when running as
// root (after handing dir to it), and nil otherwise.
func postgresCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs the postgres system user to start PostgreSQL: run `make postgres`")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// DSN returns a superuser DSN for database db.
func (p *Postgres) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.Port, db)
}

// Exec runs statements on database db as the superuser.
func (p *Postgres) Exec(ctx context.Context, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, p.DSN(db))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// NewDatabase creates an empty database with a unique name and returns its name.
func (p *Postgres) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), p.seq.Add(1))
	if err := p.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	return name, nil
}

// NewDatabaseFrom creates a database as a copy of a template prepared once by
// prepare (for example: apply the migrations). Copies are cheap, so each test
// gets its own.
func (p *Postgres) NewDatabaseFrom(ctx context.Context, prepare func(dsn string) error) (string, error) {
	p.mu.Lock()
	if p.template == "" {
		tmpl, err := p.NewDatabase(ctx)
		if err == nil {
			err = prepare(p.DSN(tmpl))
		}
		if err != nil {
			p.mu.Unlock()
			return "", fmt.Errorf("prepare template database: %w", err)
		}
		p.template = tmpl
	}
	tmpl := p.template
	p.mu.Unlock()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), p.seq.Add(1))
	if err := p.Exec(ctx, "postgres", fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{tmpl}.Sanitize())); err != nil {
		return "", fmt.Errorf("copy template database: %w", err)
	}
	return name, nil
}

// MigratedDatabase returns the DSN of a new database with every Lethe
// migration applied (a cheap copy of a template migrated once).
func (p *Postgres) MigratedDatabase(ctx context.Context) (string, error) {
	name, err := p.NewDatabaseFrom(ctx, func(dsn string) error {
		_, err := postgres.Migrate(ctx, dsn)
		return err
	})
	if err != nil {
		return "", err
	}
	return p.DSN(name), nil
}

// Stop shuts the server down (fast shutdown, by PID) and removes its folder.
func (p *Postgres) Stop() {
	if p == nil {
		return
	}
	p.StopServer()
	_ = os.RemoveAll(p.Dir)
}

// StartReplica starts a streaming replica of p: pg_basebackup with -R into a
// temp folder, then a hot standby on its own loopback port.
func (p *Postgres) StartReplica() (*Postgres, error) {
	return startCluster(p.bin, "lethe-pg-replica-", func(data string, cred *syscall.Credential) error {
		base := exec.Command(filepath.Join(p.bin, "pg_basebackup"), "-D", data, "-R", "-X", "stream", "-c", "fast",
			"-h", "127.0.0.1", "-p", itoa(p.Port), "-U", "postgres", "--no-sync")
		base.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := base.CombinedOutput(); err != nil {
			return fmt.Errorf("pg_basebackup: %w\n%s", err, out)
		}
		return nil
	})
}

// TableDigests returns an md5 of every row of every table in the schemas that
// Lethe may touch (memory, memory_derived, lethe, public), keyed by table:
// equal maps mean byte-for-byte equal data.
func TableDigests(ctx context.Context, conn *pgx.Conn) (map[string]string, error) {
	rows, err := conn.Query(ctx, `SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables
		WHERE schemaname IN ('memory', 'memory_derived', 'lethe', 'public')`)
	if err != nil {
		return nil, err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, table := range tables {
		var d *string
		if err := conn.QueryRow(ctx, `SELECT md5(string_agg(x::text, '|' ORDER BY x::text)) FROM `+table+` x`).Scan(&d); err != nil {
			return nil, fmt.Errorf("digest %s: %w", table, err)
		}
		out[table] = "<empty>"
		if d != nil {
			out[table] = *d
		}
	}
	return out, nil
}

// ManagerDSN turns a superuser DSN of a test cluster into the DSN of the
// login role lethe_manager, a member of migration 00004's lethe_operator
// and nothing more, creating the roles when create is set (a replica gets
// them by replication). Tests run the manager as that role (S3).
func ManagerDSN(ctx context.Context, dsn string, create bool) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil || u.User.Username() != "postgres" {
		return dsn, err
	}
	if create {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return "", err
		}
		defer func() { _ = conn.Close(ctx) }()
		if _, err := conn.Exec(ctx, `DO $$ BEGIN
			IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lethe_operator') THEN CREATE ROLE lethe_operator NOLOGIN; END IF;
			IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lethe_manager') THEN CREATE ROLE lethe_manager LOGIN IN ROLE lethe_operator; END IF;
			END $$;
			ALTER ROLE lethe_manager SET log_parameter_max_length = 0;
			ALTER ROLE lethe_manager SET log_parameter_max_length_on_error = 0`); err != nil {
			return "", err
		}
	}
	u.User = url.User("lethe_manager")
	return u.String(), nil
}

// Dump writes database db to file with pg_dump's custom format: every
// schema, the erasure ledger and receipts included, as a backup holds them.
func (p *Postgres) Dump(db, file string) error {
	cmd := exec.Command(filepath.Join(p.bin, "pg_dump"), "--format=custom", "--file="+file, "--dbname="+p.DSN(db))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_dump: %w\n%s", err, out)
	}
	return nil
}

// Restore replaces database db with the dump in file, as a restore from a
// backup does: the database is dropped (its connections ended), created
// again and filled by pg_restore.
func (p *Postgres) Restore(ctx context.Context, db, file string) error {
	return p.RestoreWith(ctx, db, file, nil)
}

// RestoreWith is Restore, calling whileEmpty (when not nil) between the
// database's creation and pg_restore: a test can take a lock in the new
// database that holds back what a client would do once it is filled.
func (p *Postgres) RestoreWith(ctx context.Context, db, file string, whileEmpty func() error) error {
	if err := p.Recreate(ctx, db); err != nil {
		return err
	}
	if whileEmpty != nil {
		if err := whileEmpty(); err != nil {
			return err
		}
	}
	if out, err := p.PgRestore(db, file, "--exit-on-error"); err != nil {
		return fmt.Errorf("pg_restore: %w\n%s", err, out)
	}
	return nil
}

// Recreate drops database db, ending its connections, and creates it empty.
func (p *Postgres) Recreate(ctx context.Context, db string) error {
	ident := pgx.Identifier{db}.Sanitize()
	if err := p.Exec(ctx, "postgres", "DROP DATABASE "+ident+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop %s: %w", db, err)
	}
	if err := p.Exec(ctx, "postgres", "CREATE DATABASE "+ident); err != nil {
		return fmt.Errorf("create %s: %w", db, err)
	}
	return nil
}

// PgRestoreScript returns the SQL script pg_restore makes of file with args.
func (p *Postgres) PgRestoreScript(file string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(p.bin, "pg_restore"), append(args, "--file=-", file)...)
	cmd.Stderr = os.Stderr
	return cmd.Output()
}

// Psql runs psql against database db with args and returns its output.
func (p *Postgres) Psql(db string, args ...string) ([]byte, error) {
	args = append([]string{"--no-psqlrc", "--set=ON_ERROR_STOP=1", "--dbname=" + p.DSN(db)}, args...)
	return exec.Command(filepath.Join(p.bin, "psql"), args...).CombinedOutput()
}

// PgRestore runs pg_restore of file into database db with args and returns
// its output. Without --exit-on-error pg_restore goes on past the
// statements that fail and exits with status 1 if any did.
func (p *Postgres) PgRestore(db, file string, args ...string) ([]byte, error) {
	args = append(args, "--dbname="+p.DSN(db), file)
	return exec.Command(filepath.Join(p.bin, "pg_restore"), args...).CombinedOutput()
}
