package server

import (
	"context"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/store"
)

// routeTTL bounds how long a cached route is used without reading the
// store again: what a write through another control plane replica (a
// destroy, a node marked down) may take to be seen here. A stale route
// reaches the edge, which answers for a sandbox it no longer has.
const routeTTL = time.Second

// maxRoutes bounds the cache; when full it starts over.
const maxRoutes = 1 << 16

// routes caches, for the commands' hot path (exec, files, processes), the
// records of running sandboxes, so that a warm exec does not read the
// store each time (a SQLite read was ~15% of the server's CPU per exec).
// Every write of a sandbox record through this server drops its entry
// (routeStore); entries live routeTTL at most. The tenant check is made
// on every use, against the cached record's tenant.
type routes struct {
	mu sync.Mutex
	m  map[string]routeEntry
	// gen counts invalidations: a record read before one is not cached.
	gen uint64
}

type routeEntry struct {
	sb store.Sandbox
	at time.Time
}

func newRoutes() *routes { return &routes{m: map[string]routeEntry{}} }

func (r *routes) get(id string) (store.Sandbox, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[id]
	if !ok || time.Since(e.at) > routeTTL {
		return store.Sandbox{}, false
	}
	return e.sb, true
}

func (r *routes) generation() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

// put caches a running sandbox's record read at generation gen, unless an
// invalidation came since.
func (r *routes) put(sb store.Sandbox, gen uint64) {
	if sb.API.State != api.StateRunning {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if gen != r.gen {
		return
	}
	if len(r.m) >= maxRoutes {
		clear(r.m)
	}
	r.m[sb.API.ID] = routeEntry{sb: sb, at: time.Now()}
}

func (r *routes) drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	delete(r.m, id)
}

func (r *routes) dropAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	clear(r.m)
}

// routeStore is the server's store with every sandbox write dropping the
// sandbox's cached route.
type routeStore struct {
	store.Store
	routes *routes
}

func (s routeStore) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	defer s.routes.drop(sb.API.ID)
	s.routes.drop(sb.API.ID)
	return s.Store.UpdateSandbox(ctx, sb)
}

func (s routeStore) MoveSandbox(ctx context.Context, sb *store.Sandbox, node string) error {
	defer s.routes.drop(sb.API.ID)
	s.routes.drop(sb.API.ID)
	return s.Store.MoveSandbox(ctx, sb, node)
}

func (s routeStore) MarkSandboxesLost(ctx context.Context, node string) (int, error) {
	defer s.routes.dropAll()
	s.routes.dropAll()
	return s.Store.MarkSandboxesLost(ctx, node)
}
