package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/FalkorDB/falkordb-go/v2"
)

// FalkorDB is a Valkey server with the FalkorDB module loaded, on a loopback port.
type FalkorDB struct {
	Port int
	Dir  string
	args []string
	proc *process
}

// FalkorDBModule is the module path ($LETHE_FALKORDB_MODULE, default bin/falkordb.so).
func FalkorDBModule() string {
	if v := os.Getenv("LETHE_FALKORDB_MODULE"); v != "" {
		return v
	}
	root, err := RepoRoot()
	if err != nil {
		return "bin/falkordb.so"
	}
	return filepath.Join(root, "bin", "falkordb.so")
}

// StartFalkorDB starts valkey-server with the FalkorDB module, without persistence.
func StartFalkorDB() (*FalkorDB, error) {
	server, err := exec.LookPath(envOr("LETHE_VALKEY_SERVER", "valkey-server"))
	if err != nil {
		return nil, missing("valkey-server", "$PATH", "falkordb")
	}
	module := FalkorDBModule()
	if _, err := os.Stat(module); err != nil {
		return nil, missing("the FalkorDB module", module, "falkordb")
	}
	dir, err := os.MkdirTemp("", "lethe-falkordb-")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	f := &FalkorDB{Port: port, Dir: dir, args: []string{server, "--port", itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--loadmodule", module}}
	if err := f.launch(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return f, nil
}

func (f *FalkorDB) launch() error {
	proc, err := start("valkey-server", exec.Command(f.args[0], f.args[1:]...), syscall.SIGKILL)
	if err != nil {
		return err
	}
	f.proc = proc
	if err := proc.waitFor(20*time.Second, f.ping); err != nil {
		proc.stop(syscall.SIGKILL, time.Second)
		return err
	}
	return nil
}

// SaveAndStop stops the server with SHUTDOWN SAVE, keeping its folder:
// Restart brings it back with the same data and port, as a FalkorDB with
// persistence would come back from an outage. The save happens inside the
// shutdown, after the last command: a SAVE followed by a signal lost the
// writes acknowledged in between (the history checker saw a prune undone).
func (f *FalkorDB) SaveAndStop() error {
	conn, err := net.DialTimeout("tcp", f.Addr(), time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write([]byte("*2\r\n$8\r\nSHUTDOWN\r\n$4\r\nSAVE\r\n")); err != nil {
		return fmt.Errorf("SHUTDOWN SAVE: %w", err)
	}
	// A server that shuts down closes the connection without a reply.
	if line, err := bufio.NewReader(conn).ReadString('\n'); err == nil {
		return fmt.Errorf("SHUTDOWN SAVE answered %q", strings.TrimSpace(line))
	}
	select {
	case <-f.proc.done:
		return nil
	case <-time.After(30 * time.Second):
		f.proc.stop(syscall.SIGKILL, time.Second)
		return errors.New("FalkorDB did not exit after SHUTDOWN SAVE")
	}
}

// Restart starts a server stopped by SaveAndStop on the same port and folder.
func (f *FalkorDB) Restart() error { return f.launch() }

// URL is the falkor:// URL of the server.
func (f *FalkorDB) URL() string { return fmt.Sprintf("falkor://127.0.0.1:%d", f.Port) }

// Addr is host:port.
func (f *FalkorDB) Addr() string { return fmt.Sprintf("127.0.0.1:%d", f.Port) }

// ping checks the server answers and the graph module is loaded.
func (f *FalkorDB) ping() error {
	if err := f.command("*1\r\n$10\r\nGRAPH.LIST\r\n", "*"); err != nil {
		return fmt.Errorf("GRAPH.LIST: %w: is the FalkorDB module loaded?", err)
	}
	return nil
}

// command sends one RESP command and checks the reply's first line.
func (f *FalkorDB) command(resp, wantPrefix string) error {
	conn, err := net.DialTimeout("tcp", f.Addr(), time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(resp)); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, wantPrefix) {
		return fmt.Errorf("answered %q", strings.TrimSpace(line))
	}
	return nil
}

// Graphs lists the server's graphs.
func (f *FalkorDB) Graphs() ([]string, error) {
	var graphs []string
	err := f.withClient(func(db *falkordb.FalkorDB) (err error) {
		graphs, err = db.ListGraphs()
		return err
	})
	return graphs, err
}

// DeleteGraph removes a graph and everything in it (a finished test's, so
// that the server's saves and loads do not grow with every test before it).
// A graph that does not exist is not an error.
func (f *FalkorDB) DeleteGraph(key string) error {
	return f.withClient(func(db *falkordb.FalkorDB) error {
		graphs, err := db.ListGraphs()
		if err != nil || !slices.Contains(graphs, key) {
			return err
		}
		if err := db.SelectGraph(key).Delete(); err != nil {
			return fmt.Errorf("GRAPH.DELETE %s: %w", key, err)
		}
		return nil
	})
}

// withClient runs do with a client of the server, closed after it.
func (f *FalkorDB) withClient(do func(*falkordb.FalkorDB) error) error {
	db, err := falkordb.FalkorDBNew(&falkordb.ConnectionOption{Addr: f.Addr()})
	if err != nil {
		return err
	}
	defer func() { _ = db.Conn.Close() }()
	return do(db)
}

// Stop stops the server by PID and removes its folder.
func (f *FalkorDB) Stop() {
	if f == nil {
		return
	}
	f.proc.stop(syscall.SIGTERM, 10*time.Second)
	_ = os.RemoveAll(f.Dir)
}
