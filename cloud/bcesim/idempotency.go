package bcesim

// idemCache remembers the successful response of a mutation per clientToken,
// so a retried request with the same token gets the same answer instead of
// applying the mutation twice. It is bounded and evicts oldest first. The
// server only touches it while holding its world lock, so lookup, mutation
// and store are atomic with respect to a concurrent duplicate.
type idemCache struct {
	max   int
	items map[string]cachedResponse
	order []string
}

type cachedResponse struct {
	status int
	body   any
}

func newIdemCache(max int) *idemCache {
	return &idemCache{max: max, items: map[string]cachedResponse{}}
}

func (c *idemCache) get(key string) (cachedResponse, bool) {
	r, ok := c.items[key]
	return r, ok
}

func (c *idemCache) put(key string, r cachedResponse) {
	if _, ok := c.items[key]; ok {
		return
	}
	if len(c.order) >= c.max {
		delete(c.items, c.order[0])
		c.order = c.order[1:]
	}
	c.items[key] = r
	c.order = append(c.order, key)
}
