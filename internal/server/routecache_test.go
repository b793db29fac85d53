package server

import (
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/store"
)

// TestRoutesCache: only running sandboxes are cached; a write dropping
// an entry also keeps out a record read before it (an exec that read the
// store before a destroy must not cache the dead route after it).
func TestRoutesCache(t *testing.T) {
	r := newRoutes()
	sb := store.Sandbox{Tenant: "t1", API: api.Sandbox{ID: "sb-1", State: api.StateRunning, Node: "n1"}}
	r.put(sb, r.generation())
	if got, ok := r.get("sb-1"); !ok || got.API.Node != "n1" || got.Tenant != "t1" {
		t.Fatalf("get after put: %+v %v", got, ok)
	}
	r.drop("sb-1")
	if _, ok := r.get("sb-1"); ok {
		t.Fatal("a dropped route is still served")
	}
	gen := r.generation()
	r.drop("sb-1") // a destroy between the read and the put
	r.put(sb, gen)
	if _, ok := r.get("sb-1"); ok {
		t.Fatal("a record read before an invalidation was cached")
	}
	paused := sb
	paused.API.State = api.StatePaused
	r.put(paused, r.generation())
	if _, ok := r.get("sb-1"); ok {
		t.Fatal("a paused sandbox was cached")
	}
	r.put(sb, r.generation())
	r.dropAll()
	if _, ok := r.get("sb-1"); ok {
		t.Fatal("dropAll left a route")
	}
}
