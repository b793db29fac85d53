package server

import (
	"context"
	"net/http"
	"sort"
	"sync"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/store"
)

// Bounds of a layer's usage report: it reads the manifests of the layers
// the tenant sees, stats the layer's chunks and lists sandboxes, so a
// big tenant gets a partial answer (Truncated) rather than a slow one.
const (
	usageMaxLayers    = 500
	usageMaxChunkStat = 4000
	usageMaxSandboxes = 100
)

// chunkSets caches the distinct chunks of layers by digest: manifests
// never change.
type chunkSets struct {
	mu sync.Mutex
	m  map[string]map[string]int64 // digest → chunk digest → size
}

func (c *chunkSets) get(ctx context.Context, ls *layer.Store, digest string) (map[string]int64, error) {
	c.mu.Lock()
	set, ok := c.m[digest]
	c.mu.Unlock()
	if ok {
		return set, nil
	}
	m, _, err := ls.Manifest(ctx, digest)
	if err != nil {
		return nil, err
	}
	set = map[string]int64{}
	for _, p := range []*layer.Part{&m.Meta, m.Blob} {
		if p == nil {
			continue
		}
		for _, ch := range p.Chunks {
			set[ch.Digest] = ch.Size
		}
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) > 4096 {
		c.m = map[string]map[string]int64{}
	}
	c.m[digest] = set
	c.mu.Unlock()
	return set, nil
}

// layerUsage is GET /v1/layers/{ref}?usage=1: what the layer costs in the
// layer store after dedup, which of its chunks other layers (that the
// tenant sees) share, which of the tenant's sandboxes run on it, and its
// snapshot lineage.
func (s *Server) layerUsage(ctx context.Context, tenant string, l store.Layer) (*api.LayerUsage, error) {
	u := &api.LayerUsage{SharedWith: []api.LayerShare{}, Sandboxes: []string{}}
	all, err := s.store.ListLayers(ctx, tenant)
	if err != nil {
		return nil, err
	}
	byDigest := map[string]store.Layer{}
	for _, o := range all {
		if _, ok := byDigest[o.Digest]; !ok || o.Tenant == tenant {
			byDigest[o.Digest] = o
		}
	}
	ref := func(d string) string {
		if o, ok := byDigest[d]; ok {
			return o.Name + ":" + o.Tag
		}
		return ""
	}

	// Lineage: the parents it stacks on, and the snapshots stacked on it.
	for _, p := range l.Parents {
		u.Lineage.Ancestors = append(u.Lineage.Ancestors, api.LayerNode{Digest: p, Ref: ref(p)})
	}
	children := map[string][]store.Layer{} // by the digest they stack directly on
	for _, o := range all {
		if n := len(o.Parents); n > 0 {
			children[o.Parents[n-1]] = append(children[o.Parents[n-1]], o)
		}
	}
	var grow func(d string, depth int) []api.LayerNode
	grow = func(d string, depth int) []api.LayerNode {
		var out []api.LayerNode
		for _, c := range children[d] {
			n := api.LayerNode{Digest: c.Digest, Ref: c.Name + ":" + c.Tag, Kind: c.Kind}
			if depth < 16 && c.Digest != d {
				n.Children = grow(c.Digest, depth+1)
			}
			out = append(out, n)
		}
		return out
	}
	u.Lineage.Descendants = grow(l.Digest, 0)

	// Sandboxes of the tenant that run on it, live ones.
	sbs, _, err := s.store.ListSandboxes(ctx, store.SandboxFilter{Tenant: tenant, Layer: l.Digest, Limit: usageMaxSandboxes,
		States: []string{api.StateCreating, api.StateRunning, api.StatePaused, api.StateLost}})
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		u.Sandboxes = append(u.Sandboxes, sb.API.ID)
	}
	u.Truncated = len(sbs) == usageMaxSandboxes

	// Chunks, if the layer store is here to ask.
	ls := s.cfg.Layers
	if ls == nil {
		return u, nil
	}
	mine, err := s.chunks.get(ctx, ls, l.Digest)
	if err != nil {
		return nil, err
	}
	u.Chunks = len(mine)
	for _, size := range mine {
		u.DedupBytes += size
	}
	shared := map[string]bool{}
	var shares []api.LayerShare
	seen := 0
	for d, o := range byDigest {
		if d == l.Digest {
			continue
		}
		if seen++; seen > usageMaxLayers {
			u.Truncated = true
			break
		}
		set, err := s.chunks.get(ctx, ls, d)
		if err != nil {
			continue // a layer whose objects are gone (being collected)
		}
		var n int
		var bytes int64
		for c, size := range mine {
			if _, ok := set[c]; ok {
				n++
				bytes += size
				shared[c] = true
			}
		}
		if n > 0 {
			shares = append(shares, api.LayerShare{Ref: o.Name + ":" + o.Tag, Digest: d, Chunks: n, Bytes: bytes})
		}
	}
	sort.Slice(shares, func(i, j int) bool {
		if shares[i].Chunks != shares[j].Chunks {
			return shares[i].Chunks > shares[j].Chunks
		}
		return shares[i].Ref < shares[j].Ref
	})
	if len(shares) > 50 {
		shares, u.Truncated = shares[:50], true
	}
	u.SharedWith = append(u.SharedWith, shares...)
	u.SharedChunks = len(shared)
	for c, size := range mine {
		if shared[c] {
			u.SharedBytes += size
		}
	}
	// What the chunks take in the store (compressed), if few enough to ask.
	if len(mine) <= usageMaxChunkStat {
		var stored int64
		for c := range mine {
			info, err := ls.Blobs().Stat(ctx, layer.ChunkKey(c))
			if err != nil {
				stored = -1
				break
			}
			stored += info.Size
		}
		if stored >= 0 {
			u.StoredBytes = &stored
		}
	}
	return u, nil
}

// getLayer answers GET /v1/layers/{ref}, with ?usage=1 its usage too.
func (s *Server) getLayer(w http.ResponseWriter, r *http.Request) error {
	tenant := principalFrom(r.Context()).Tenant
	l, err := s.resolveLayer(r.Context(), tenant, r.PathValue("ref"))
	if err != nil {
		return err
	}
	out := layerAPI(l)
	usage, err := queryBool(r.URL.Query(), "usage")
	if err != nil {
		return err
	}
	if usage {
		if out.Usage, err = s.layerUsage(r.Context(), tenant, l); err != nil {
			return err
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
