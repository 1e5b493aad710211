package history

import (
	"bufio"
	"context"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// graphWrite is one write query FalkorDB executed (GRAPH.QUERY, not
// GRAPH.RO_QUERY), with the session IDs it named.
type graphWrite struct {
	Key string
	IDs []string
}

// graphRecorder follows FalkorDB's MONITOR stream, which lists every
// command the server executes. It reconnects after a restart; a write that
// lands between the restart and the reconnection (a few milliseconds) is
// not recorded, which is why the checker also compares the graph's final
// state with its first.
type graphRecorder struct {
	addr      string
	mu        sync.Mutex
	writes    []graphWrite
	connected atomic.Int64 // connections made so far
	cancel    context.CancelFunc
	done      chan struct{}
}

var (
	monitorLine = regexp.MustCompile(`^\+[0-9.]+ \[[^\]]*\] "GRAPH\.(QUERY|DELETE)" "([^"]+)"(.*)$`)
	uuidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
)

func startGraphRecorder(ctx context.Context, addr string) *graphRecorder {
	ctx, cancel := context.WithCancel(ctx)
	g := &graphRecorder{addr: addr, cancel: cancel, done: make(chan struct{})}
	go g.run(ctx)
	g.waitConnected(1)
	return g
}

func (g *graphRecorder) run(ctx context.Context) {
	defer close(g.done)
	for ctx.Err() == nil {
		conn, err := net.DialTimeout("tcp", g.addr, 200*time.Millisecond)
		if err != nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		g.follow(conn)
		stop()
		_ = conn.Close()
	}
}

func (g *graphRecorder) follow(conn net.Conn) {
	if _, err := conn.Write([]byte("*1\r\n$7\r\nMONITOR\r\n")); err != nil {
		return
	}
	rd := bufio.NewReaderSize(conn, 1<<20)
	first, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "+OK") {
		return
	}
	g.connected.Add(1)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		m := monitorLine.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
		if m == nil {
			continue
		}
		g.mu.Lock()
		g.writes = append(g.writes, graphWrite{Key: m[2], IDs: uuidPattern.FindAllString(m[3], -1)})
		g.mu.Unlock()
	}
}

// waitConnected waits until MONITOR has been started n times in all.
func (g *graphRecorder) waitConnected(n int64) {
	for deadline := time.Now().Add(20 * time.Second); g.connected.Load() < n && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

func (g *graphRecorder) stop() []graphWrite {
	g.cancel()
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.writes
}
