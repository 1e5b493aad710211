package conncache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/lethe-dev/lethe/internal/conncache"
)

// conn is a fake connection: which DSN it was opened with, and whether it
// was closed.
type conn struct {
	dsn    string
	closed bool
}

// recorder opens and closes fake connections and counts both.
type recorder struct {
	mu     sync.Mutex
	opened []*conn
	closes int
	fail   map[string]error
}

func (r *recorder) open(_ context.Context, dsn string) (*conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fail[dsn]; err != nil {
		return nil, err
	}
	c := &conn{dsn: dsn}
	r.opened = append(r.opened, c)
	return c, nil
}

func (r *recorder) close(c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.closed {
		panic("closed twice: " + c.dsn)
	}
	c.closed = true
	r.closes++
}

func (r *recorder) counts() (opened, closed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.opened), r.closes
}

func newCache() (*conncache.Cache[*conn], *recorder) {
	r := &recorder{fail: map[string]error{}}
	return conncache.New(r.open, r.close), r
}

func get(t *testing.T, c *conncache.Cache[*conn], key, dsn string) *conn {
	t.Helper()
	got, err := c.Get(context.Background(), key, dsn)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return got
}

func TestGetOpensOncePerKeyAndSecret(t *testing.T) {
	c, r := newCache()
	a := get(t, c, "store-a", "dsn-1")
	if again := get(t, c, "store-a", "dsn-1"); again != a {
		t.Fatal("a second Get with the same DSN opened a new connection")
	}
	b := get(t, c, "store-b", "dsn-1")
	if b == a {
		t.Fatal("two keys share one connection")
	}
	if opened, closed := r.counts(); opened != 2 || closed != 0 {
		t.Fatalf("opened %d, closed %d; want 2 and 0", opened, closed)
	}
}

func TestGetReopensWhenTheSecretChanges(t *testing.T) {
	c, r := newCache()
	old := get(t, c, "store-a", "dsn-1")
	rotated := get(t, c, "store-a", "dsn-2")
	if rotated == old || rotated.dsn != "dsn-2" {
		t.Fatalf("after a rotation Get returned %+v, want a connection opened with dsn-2", rotated)
	}
	if !old.closed {
		t.Fatal("the connection of the old secret was not closed")
	}
	if again := get(t, c, "store-a", "dsn-2"); again != rotated {
		t.Fatal("the reopened connection is not cached")
	}
	if opened, closed := r.counts(); opened != 2 || closed != 1 {
		t.Fatalf("opened %d, closed %d; want 2 and 1", opened, closed)
	}
}

func TestAFailedOpenIsNotCached(t *testing.T) {
	c, r := newCache()
	old := get(t, c, "store-a", "dsn-1")
	boom := errors.New("no route to host")
	r.fail["dsn-bad"] = boom
	if _, err := c.Get(context.Background(), "store-a", "dsn-bad"); !errors.Is(err, boom) {
		t.Fatalf("Get with a failing open: %v, want the open's error", err)
	}
	if !old.closed || c.Len() != 0 {
		t.Fatalf("after a failed reopen: old closed %v, %d cached; want the old one closed and nothing cached", old.closed, c.Len())
	}
	delete(r.fail, "dsn-bad")
	if got := get(t, c, "store-a", "dsn-bad"); got.closed {
		t.Fatal("the retry returned a closed connection")
	}
}

func TestForgetAndForgetPrefixCloseOnlyTheirKeys(t *testing.T) {
	c, _ := newCache()
	primary := get(t, c, "uid-1/primary", "p")
	replica := get(t, c, "uid-1/replica 0", "r")
	other := get(t, c, "uid-2/primary", "p")
	graphC := get(t, c, "uid-2/graph", "g")

	c.Forget("uid-2/graph")
	if !graphC.closed || other.closed {
		t.Fatal("Forget closed the wrong connections")
	}
	c.Forget("no-such-key")
	c.ForgetPrefix("uid-1/")
	if !primary.closed || !replica.closed || other.closed {
		t.Fatalf("ForgetPrefix(uid-1/): primary closed %v, replica closed %v, other closed %v", primary.closed, replica.closed, other.closed)
	}
	if c.Len() != 1 {
		t.Fatalf("%d connections left, want 1", c.Len())
	}
	if again := get(t, c, "uid-1/primary", "p"); again == primary {
		t.Fatal("Get after Forget returned the forgotten connection")
	}
}

func TestCloseClosesEverythingAndTheCacheStaysUsable(t *testing.T) {
	c, r := newCache()
	var conns []*conn
	for i := range 5 {
		conns = append(conns, get(t, c, fmt.Sprintf("k%d", i), "dsn"))
	}
	c.Close()
	for i, cn := range conns {
		if !cn.closed {
			t.Errorf("connection %d not closed", i)
		}
	}
	if c.Len() != 0 {
		t.Fatalf("%d connections left after Close", c.Len())
	}
	c.Close() // a second Close closes nothing twice (the recorder panics if it does)
	if fresh := get(t, c, "k0", "dsn"); fresh.closed {
		t.Fatal("Get after Close returned a closed connection")
	}
	if opened, closed := r.counts(); opened != 6 || closed != 5 {
		t.Fatalf("opened %d, closed %d; want 6 and 5", opened, closed)
	}
}

// Run with -race: concurrent Gets, rotations, Forgets and Closes never
// hand out a connection twice-opened for one key and secret, never close
// one twice, and leave every opened connection either cached or closed.
func TestConcurrentUse(t *testing.T) {
	c, r := newCache()
	const workers, rounds = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				key := fmt.Sprintf("store-%d/primary", i%3)
				switch {
				case i%50 == 49:
					c.ForgetPrefix("store-1/")
				case i%97 == 96:
					c.Close()
				case i%7 == 6:
					c.Forget(key)
				default:
					dsn := fmt.Sprintf("dsn-%d", (i/20+w)%2)
					if _, err := c.Get(context.Background(), key, dsn); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	opened, closed := r.counts()
	if opened != closed+c.Len() {
		t.Fatalf("opened %d, closed %d, cached %d: a connection leaked", opened, closed, c.Len())
	}

	// Many Gets of one new key and secret at once open it once.
	before, _ := r.counts()
	got := make([]*conn, 16)
	for i := range got {
		wg.Go(func() { got[i], _ = c.Get(context.Background(), "same", "dsn-same") })
	}
	wg.Wait()
	after, _ := r.counts()
	if after-before != 1 {
		t.Fatalf("16 concurrent Gets of one key opened %d connections, want 1", after-before)
	}
	for _, g := range got {
		if g != got[0] {
			t.Fatal("concurrent Gets of one key returned different connections")
		}
	}
	c.Close()
	if opened, closed := r.counts(); opened != closed {
		t.Fatalf("after Close: opened %d, closed %d", opened, closed)
	}
}
