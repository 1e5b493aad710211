package graph

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/FalkorDB/falkordb-go/v2"
	"github.com/redis/go-redis/v9"
)

// FalkorDB takes query parameters as a text header ("CYPHER k=v ...") in
// front of the query. falkordb-go builds it with strconv.Quote, whose \x01 and
// \u200b escapes FalkorDB does not understand, and does not check map keys.
// Lethe builds the header itself: keys must be plain identifiers (never user
// input), strings escape only what FalkorDB's lexer reads as escapes, and a
// value of any other type is an error rather than a panic.

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

var errNUL = errors.New("a string parameter holds a NUL byte, which FalkorDB cannot carry")

// literal writes v as a Cypher literal.
func literal(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case string:
		return stringLiteral(b, x)
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
	case []string:
		return list(b, len(x), func(i int) any { return x[i] })
	case []int64:
		return list(b, len(x), func(i int) any { return x[i] })
	case []any:
		return list(b, len(x), func(i int) any { return x[i] })
	case []map[string]any:
		return list(b, len(x), func(i int) any { return x[i] })
	case map[string]any:
		return mapLiteral(b, x)
	default:
		return fmt.Errorf("unsupported parameter type %T", v)
	}
	return nil
}

// stringLiteral writes s as a double-quoted Cypher string, escaping only
// what FalkorDB's lexer reads as escapes; a NUL byte is an error.
func stringLiteral(b *strings.Builder, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return errNUL
	}
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return nil
}

// mapLiteral writes m as a Cypher map with its keys sorted; every key must
// be a plain identifier, checked before anything is written.
func mapLiteral(b *strings.Builder, m map[string]any) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		if !identifier.MatchString(k) {
			return fmt.Errorf("map key %q is not a plain identifier", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte(':')
		if err := literal(b, m[k]); err != nil {
			return err
		}
	}
	b.WriteByte('}')
	return nil
}

// list writes the n elements at(0)..at(n-1) as a Cypher list.
func list(b *strings.Builder, n int, at func(int) any) error {
	b.WriteByte('[')
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := literal(b, at(i)); err != nil {
			return err
		}
	}
	b.WriteByte(']')
	return nil
}

// paramsHeader renders params as FalkorDB's "CYPHER k=v " prefix.
func paramsHeader(params map[string]any) (string, error) {
	if len(params) == 0 {
		return "", nil
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		if !identifier.MatchString(k) {
			return "", fmt.Errorf("parameter name %q is not a plain identifier", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("CYPHER ")
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		if err := literal(&b, params[k]); err != nil {
			return "", fmt.Errorf("parameter %s: %w", k, err)
		}
		b.WriteByte(' ')
	}
	return b.String(), nil
}

// quoteName returns a label or relationship type for use in a query. Names
// come from the graph itself, so anything but a plain identifier is refused
// rather than quoted.
func quoteName(name string) (string, error) {
	if !identifier.MatchString(name) {
		return "", fmt.Errorf("graph label or relationship type %q is not a plain identifier; Lethe will not put it in a query", name)
	}
	return "`" + name + "`", nil
}

// Graph is one named graph on a FalkorDB server.
type Graph struct {
	name string
	c    *Client
	fg   *falkordb.Graph
}

// Graph returns the graph called name.
func (c *Client) Graph(name string) *Graph {
	return &Graph{name: name, c: c, fg: c.db.SelectGraph(name)}
}

// Ping checks the server answers and has the graph module loaded.
func (g *Graph) Ping(ctx context.Context) error { return g.c.Ping(ctx) }

// Name is the graph's key.
func (g *Graph) Name() string { return g.name }

// Query runs a write query. The context bounds the call; its deadline is
// also passed to FalkorDB as the query timeout. A query that timed out on
// the client may still have run on the server: callers must be idempotent.
func (g *Graph) Query(ctx context.Context, query string, params map[string]any) (*falkordb.QueryResult, error) {
	return g.run(ctx, "GRAPH.QUERY", query, params)
}

// ReadQuery runs a read-only query.
func (g *Graph) ReadQuery(ctx context.Context, query string, params map[string]any) (*falkordb.QueryResult, error) {
	return g.run(ctx, "GRAPH.RO_QUERY", query, params)
}

func (g *Graph) run(ctx context.Context, cmd, query string, params map[string]any) (*falkordb.QueryResult, error) {
	res, err := g.pipe(ctx, cmd, []string{query}, params)
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// pipe sends queries with the same parameters in one round trip and returns
// their results in order, or the first error. go-redis writes them down one
// connection and FalkorDB answers a connection's commands one after the
// other, so they run in order, each atomic on its own: a write pipeline is
// the same sequence of queries (not a transaction), without the round trips
// between them. Every query runs even when an earlier one fails.
func (g *Graph) pipe(ctx context.Context, cmd string, queries []string, params map[string]any) ([]*falkordb.QueryResult, error) {
	header, err := paramsHeader(params)
	if err != nil {
		return nil, err
	}
	var timeout []any
	if dl, ok := ctx.Deadline(); ok {
		ms := time.Until(dl).Milliseconds()
		if ms < 1 {
			return nil, context.DeadlineExceeded
		}
		timeout = []any{"timeout", ms}
	}
	cmds := make([]*redis.Cmd, len(queries))
	_, perr := g.c.db.Conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queries {
			cmds[i] = p.Do(ctx, append([]any{cmd, g.name, header + q, "--compact"}, timeout...)...)
		}
		return nil
	})
	out := make([]*falkordb.QueryResult, len(queries))
	for i, c := range cmds {
		raw, err := c.Result()
		if err == nil && raw == nil {
			// go-redis 9.17 leaves the commands of a pipeline that never
			// reached the server (a refused dial) without an error.
			err = cmp.Or(perr, errNoReply)
		}
		if err != nil {
			// The query text is Lethe's own (values travel in the header), so it
			// may be named; the parameters are not.
			return nil, fmt.Errorf("graph %s, query %.48q…: %w", g.name, queries[i], err)
		}
		if out[i], err = falkordb.QueryResultNew(g.fg, raw); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var (
	errNoRow   = errors.New("query returned no row")
	errNoReply = errors.New("FalkorDB did not reply")
)

// scalar returns the first column of the first row as an int64.
func scalar(res *falkordb.QueryResult) (int64, error) {
	if !res.Next() {
		return 0, errNoRow
	}
	return intCell(res.Record(), 0)
}

// intCell returns the record's column i as an int64 (null is 0).
func intCell(rec *falkordb.Record, i int) (int64, error) {
	cell, err := rec.GetByIndex(i)
	if err != nil {
		return 0, err
	}
	switch v := cell.(type) {
	case int64:
		return v, nil
	case int:
		return int64(v), nil
	case nil:
		return 0, nil
	default:
		return 0, fmt.Errorf("query returned %T, want an integer", v)
	}
}

// column returns the first column of every row.
func column(res *falkordb.QueryResult) ([]any, error) {
	var out []any
	for res.Next() {
		cell, err := res.Record().GetByIndex(0)
		if err != nil {
			return nil, err
		}
		out = append(out, cell)
	}
	return out, nil
}
