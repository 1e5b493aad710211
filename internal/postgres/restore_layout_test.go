package postgres_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lethe-dev/lethe/internal/erasure"
	"github.com/lethe-dev/lethe/internal/fixture"
	"github.com/lethe-dev/lethe/internal/postgres"
	"github.com/lethe-dev/lethe/internal/testenv"
)

// pausingDB pauses the first transaction statement containing match, before
// it runs, until release is closed (paused is closed when it gets there).
type pausingDB struct {
	postgres.DB
	match           string
	once            sync.Once
	paused, release chan struct{}
}

func (d *pausingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := d.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &pausingTx{Tx: tx, d: d}, nil
}

type pausingTx struct {
	pgx.Tx
	d *pausingDB
}

func (t *pausingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, t.d.match) {
		t.d.once.Do(func() {
			close(t.d.paused)
			<-t.d.release
		})
	}
	return t.Tx.Query(ctx, sql, args...)
}

// pgRestoreList runs pg_restore of file into db with the TOC entries lines only.
func pgRestoreList(t *testing.T, db, file string, lines []string) {
	t.Helper()
	list := filepath.Join(t.TempDir(), "toc.list")
	if err := os.WriteFile(list, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(testenv.PostgresBin(), "pg_restore"), "--exit-on-error",
		"-L", list, "--dbname="+pg.DSN(db), file).CombinedOutput()
	if err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}
}

// A database restored from a pg_dump taken before an erasure brings the
// erased sessions back; the store's re-erasure must remove every
// content-keyed entry of their content. pg_restore adds the foreign keys one
// by one, then (in a later pass) the privileges: a re-erasure pass whose
// layout read began before the last keys were added and went on after the
// grants (here: paused between the two, as a busy manager is) reads a
// layout without rounds and file_snapshots. The re-erasure must not act on
// that layout: the round entries would stay, with no ledger row, for good.
func TestReeraseAfterRestoreWithLayoutReadMidRestore(t *testing.T) {
	ctx := context.Background()
	dsn := migratedDB(t)
	conn := connect(t, dsn)
	db := conn.Config().Database
	sessions := []string{"00000874-0000-4000-8000-000000000000", "00000874-0000-4000-8000-000000000001"}
	for k, s := range append(sessions, "00000874-0000-4000-8000-000000000005") {
		if err := fixture.Seed(ctx, conn, fixture.Session{ID: s, Tenant: "h874", Rounds: 2, Text: "Ada met Ken", Seed: k}); err != nil {
			t.Fatal(err)
		}
	}
	mdsn, err := testenv.ManagerDSN(ctx, dsn, true)
	if err != nil {
		t.Fatal(err)
	}
	// The backup, taken after seeding, before the request.
	file := filepath.Join(t.TempDir(), "memory.dump")
	if err := pg.Dump(db, file); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)

	req := erasure.Request{UID: "uid-a", SessionIDs: sessions}
	e := eraser(t, mdsn, "h874")
	if _, err := e.Tombstone(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, req, 10, 0); err != nil {
		t.Fatal(err)
	}

	// The restore, split where pg_restore is between the foreign keys of
	// facts and file_snapshots; privileges and the event trigger come last,
	// as pg_restore's later passes put them.
	if err := pg.Exec(ctx, "postgres", "DROP DATABASE "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(testenv.PostgresBin(), "pg_restore"), "-l", file).Output()
	if err != nil {
		t.Fatal(err)
	}
	var first, rest, late []string
	cut := false
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case line == "" || strings.HasPrefix(line, ";"):
		case strings.Contains(line, " ACL ") || strings.Contains(line, " EVENT TRIGGER "):
			late = append(late, line)
		case cut || strings.Contains(line, "FK CONSTRAINT memory file_snapshots"):
			cut = true
			rest = append(rest, line)
		default:
			first = append(first, line)
		}
	}
	if !cut {
		t.Fatal("no foreign key of memory.file_snapshots in the dump")
	}
	pgRestoreList(t, db, file, first)

	// A new pass (a restarted manager): its layout read pauses after the
	// cascading keys were listed; the restore goes on meanwhile.
	pool, err := postgres.Connect(ctx, mdsn, postgres.Options{Vector: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pdb := &pausingDB{DB: pool, match: "n.nspname NOT IN ('pg_catalog', 'information_schema')",
		paused: make(chan struct{}), release: make(chan struct{})}
	e2 := &postgres.Eraser{Pool: pdb, Schema: "memory", TenantID: "h874"}
	type result struct {
		res erasure.BatchResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := e2.Reerase(ctx, req)
		done <- result{res, err}
	}()
	select {
	case <-pdb.paused:
	case r := <-done:
		t.Fatalf("the re-erasure ended before reading the layout: %+v %v", r.res, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the re-erasure never read the layout")
	}
	pgRestoreList(t, db, file, append(rest, late...))
	close(pdb.release)
	r := <-done
	// A pass that fails (and is repeated) is fine; one that succeeds must
	// have erased everything. Repeat as the controller does.
	for i := 0; r.err != nil && i < 3; i++ {
		t.Logf("re-erasure pass failed (repeated): %v", r.err)
		r.res, r.err = eraser(t, mdsn, "h874").Reerase(ctx, req)
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("re-erasure: %d session(s), rows %v, %d content-keyed entries", r.res.Sessions, r.res.Rows, r.res.ContentIndexEntries)

	check := connect(t, pg.DSN(db))
	for _, s := range sessions {
		var rows, cache int64
		if err := check.QueryRow(ctx, `SELECT (SELECT count(*) FROM memory.sessions WHERE id = $1::uuid) +
			(SELECT count(*) FROM memory.rounds WHERE session_id = $1::uuid)`, s).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		var left []string
		rs, err := check.Query(ctx, `SELECT split_part(c.text, ' of ', 1) || ' (ledger rows: ' ||
			(SELECT count(*) FROM lethe.erasure_ledger l WHERE l.scope = 'content' AND l.record_id = lethe.content_hash(c.content_sha256)) || ')'
			FROM memory_derived.embedding_cache c WHERE strpos(c.text, $1) > 0 ORDER BY 1`, s)
		if err != nil {
			t.Fatal(err)
		}
		if left, err = pgx.CollectRows(rs, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		cache = int64(len(left))
		if rows != 0 || cache != 0 {
			t.Errorf("session %s: %d rows and %d content-keyed cache entries of its content left after its re-erasure: %v", s, rows, cache, left)
		}
	}
	// The session not requested keeps its entries.
	var live int64
	if err := check.QueryRow(ctx, `SELECT count(*) FROM memory_derived.embedding_cache WHERE strpos(text, '00000874-0000-4000-8000-000000000005') > 0`).Scan(&live); err != nil || live != 3 {
		t.Errorf("the session not requested has %d cache entries (%v), want 3", live, err)
	}
}
