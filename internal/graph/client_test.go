package graph_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lethe-dev/lethe/internal/graph"
	"github.com/lethe-dev/lethe/internal/testenv"
)

func TestOpenRefusesBadURLsWithoutEchoingThem(t *testing.T) {
	for _, u := range []string{"", "http://secret-pw@host:1", "falkor://", "secret-pw", "mysql://u:secret-pw@h:1"} {
		_, err := graph.Open(u)
		if err == nil {
			t.Errorf("%q: accepted", u)
			continue
		}
		if strings.Contains(err.Error(), "secret-pw") {
			t.Errorf("%q: error echoes the URL: %v", u, err)
		}
	}
	for _, u := range []string{"falkor://127.0.0.1:6379", "falkor://:pw@127.0.0.1:6379", "redis://127.0.0.1:6379/0", "falkors://h:1"} {
		c, err := graph.Open(u)
		if err != nil {
			t.Errorf("%q: %v", u, err)
			continue
		}
		_ = c.Close()
	}
}

func TestPingRealFalkorDB(t *testing.T) {
	fdb, err := testenv.StartFalkorDB()
	if err != nil {
		t.Fatal(err)
	}
	defer fdb.Stop()
	c, err := graph.Open(fdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}

	dead, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	down, err := graph.Open(fmt.Sprintf("falkor://127.0.0.1:%d", dead))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = down.Close() }()
	if err := down.Ping(ctx); err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
}
