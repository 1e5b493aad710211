package graph

import "github.com/redis/go-redis/v9"

// WrapConn replaces c's connection with wrap(connection): fault injection
// from the test side, without a hook in the package.
func WrapConn(c *Client, wrap func(redis.UniversalClient) redis.UniversalClient) {
	c.db.Conn = wrap(c.db.Conn)
}
