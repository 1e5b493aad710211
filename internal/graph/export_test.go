package graph

import "github.com/redis/go-redis/v9"

// WrapConn replaces c's connection with wrap(connection): fault injection
// from the test side, without a hook in the package.
func WrapConn(c *Client, wrap func(redis.UniversalClient) redis.UniversalClient) {
	c.db.Conn = wrap(c.db.Conn)
}

// SetSubqueryCheck replaces the subquery check's query (a server that ran
// subqueries once for all rows answers 1); the returned function restores it.
func SetSubqueryCheck(q string) (restore func()) {
	old := subqueryCheck
	subqueryCheck = q
	return func() { subqueryCheck = old }
}
