package server

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"sync"
	"time"

	"github.com/dsec-project/dsec/internal/store"
)

// layerCacheTTL is how long a resolved layer ref is trusted. A tag moved
// through this replica is seen at once; through another, within the TTL.
const layerCacheTTL = 2 * time.Second

// layerCache remembers how refs resolved, briefly: a training job's burst
// of creates names the same few layers thousands of times a second, and
// each would otherwise be a database read.
type layerCache struct {
	mu sync.RWMutex
	m  map[layerKey]layerEntry
}

type layerKey struct{ tenant, ref string }

type layerEntry struct {
	l       store.Layer
	expires time.Time
}

func (c *layerCache) get(tenant, ref string, now time.Time) (store.Layer, bool) {
	c.mu.RLock()
	e, ok := c.m[layerKey{tenant, ref}]
	c.mu.RUnlock()
	return e.l, ok && now.Before(e.expires)
}

func (c *layerCache) put(tenant, ref string, l store.Layer, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) > 10000 {
		c.m = map[layerKey]layerEntry{}
	}
	c.m[layerKey{tenant, ref}] = layerEntry{l: l, expires: now.Add(layerCacheTTL)}
}

// forget drops everything: a layer was written.
func (c *layerCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = nil
}

// cachedLayer is resolveLayer through the cache.
func (s *Server) cachedLayer(ctx context.Context, tenant, ref string) (store.Layer, error) {
	now := time.Now()
	if l, ok := s.layers.get(tenant, ref, now); ok {
		return l, nil
	}
	l, err := s.resolveLayer(ctx, tenant, ref)
	if err != nil {
		return l, err
	}
	s.layers.put(tenant, ref, l, now)
	return l, nil
}

// sortable32 is base32 with its alphabet in ASCII order (the same
// characters as the lowercase standard alphabet, a-z2-7), so that encoded
// strings sort like the numbers they encode.
var sortable32 = base32.NewEncoding("234567abcdefghijklmnopqrstuvwxyz").WithPadding(base32.NoPadding)

// idEpoch is where sandbox ids' clocks start.
var idEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// sandboxID makes "sb-" and 16 characters: 42 bits of milliseconds since
// idEpoch (good for 139 years), then 38 random bits. Ids made later sort
// later, so new records land at the right edge of the database's indexes
// instead of on a random page each: at thousands of creates a second,
// that is far fewer pages written per commit. The random part keeps ids
// unguessable enough and unique (the store still enforces it).
func sandboxID(now time.Time) string {
	var r [5]byte
	rand.Read(r[:])
	ms := uint64(max(0, now.Sub(idEpoch).Milliseconds())) & (1<<42 - 1)
	rand22 := (uint64(r[0])<<16 | uint64(r[1])<<8 | uint64(r[2])) & (1<<22 - 1)
	var b [10]byte
	binary.BigEndian.PutUint64(b[:8], ms<<22|rand22)
	b[8], b[9] = r[3], r[4]
	return "sb-" + sortable32.EncodeToString(b[:])
}
