package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// FalkorDB is a Valkey server with the FalkorDB module loaded, on a loopback port.
type FalkorDB struct {
	Port int
	Dir  string
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
	cmd := exec.Command(server, "--port", itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--loadmodule", module)
	proc, err := start("valkey-server", cmd, syscall.SIGKILL)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	f := &FalkorDB{Port: port, Dir: dir, proc: proc}
	if err := proc.waitFor(20*time.Second, f.ping); err != nil {
		f.Stop()
		return nil, err
	}
	return f, nil
}

// URL is the falkor:// URL of the server.
func (f *FalkorDB) URL() string { return fmt.Sprintf("falkor://127.0.0.1:%d", f.Port) }

// Addr is host:port.
func (f *FalkorDB) Addr() string { return fmt.Sprintf("127.0.0.1:%d", f.Port) }

// ping checks the server answers and the graph module is loaded.
func (f *FalkorDB) ping() error {
	conn, err := net.DialTimeout("tcp", f.Addr(), time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("*1\r\n$10\r\nGRAPH.LIST\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "*") {
		return fmt.Errorf("GRAPH.LIST answered %q: is the FalkorDB module loaded?", strings.TrimSpace(line))
	}
	return nil
}

// Stop stops the server by PID and removes its folder.
func (f *FalkorDB) Stop() {
	if f == nil {
		return
	}
	f.proc.stop(syscall.SIGTERM, 10*time.Second)
	_ = os.RemoveAll(f.Dir)
}
