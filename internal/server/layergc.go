package server

import (
	"context"
	"errors"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Collection of checkpoint layers. A checkpoint is dead once dropped (past
// the number kept), once a step at or before it runs again, or once its
// trajectory is deleted or purged. Its layer record goes first; then,
// if nothing else uses its digest (another record, a snapshot stacked on
// it, a sandbox not deleted), its objects leave the layer store — and so
// do those of the snapshots it was stacked on that nothing uses any more
// (earlier checkpoints kept alive by it). The checkpoint's row goes last,
// so a pass cut short is taken up by the next one.
//
// Layer stores dedup chunks across layers, so removing objects must not
// overlap a write of a layer (see layer.Store.Remove). Every layer write
// of the cluster goes through this control plane — uploads, and snapshots
// that nodes pack at its request — and holds layerMu shared; removal
// holds it exclusively.

// layerWriter marks a layer write in progress; call the result when its
// record is stored.
func (s *Server) layerWriter() (done func()) {
	s.layerMu.RLock()
	return s.layerMu.RUnlock
}

// kickGC asks for a collection pass soon.
func (s *Server) kickGC() {
	select {
	case s.gcKick <- struct{}{}:
	default:
	}
}

// runGC collects dead checkpoints when kicked and every interval.
func (s *Server) runGC(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.gcKick:
		}
		if err := s.collectCheckpoints(ctx); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "collect checkpoints", "err", err)
		}
		if _, err := s.collectLayers(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("collect fork and build-cache layers", "err", err)
		}
	}
}

// collectCheckpoints removes dead checkpoints and the layers only they
// used, in batches.
func (s *Server) collectCheckpoints(ctx context.Context) error {
	for {
		dead, err := s.store.DeadCheckpoints(ctx, 100)
		if err != nil || len(dead) == 0 {
			return err
		}
		var candidates []string
		for _, c := range dead {
			l, err := s.store.GetLayer(ctx, c.Tenant, c.LayerName, c.LayerTag)
			switch {
			case err == nil && l.Digest == c.Digest && l.Tenant == c.Tenant:
				candidates = append(candidates, l.Parents...)
				if err := s.store.DeleteLayer(ctx, c.Tenant, c.LayerName, c.LayerTag, c.Digest); err != nil {
					return err
				}
			case err != nil && !errors.Is(err, errdefs.ErrNotFound):
				return err
			}
			candidates = append(candidates, c.Digest)
		}
		s.layers.forget() // no create may resolve a deleted checkpoint from the cache
		removed, err := s.removeUnused(ctx, candidates)
		if err != nil {
			return err
		}
		for _, c := range dead {
			if err := s.store.DeleteCheckpoint(ctx, c); err != nil {
				return err
			}
		}
		s.metrics.checkpointsCollected.Add(float64(len(dead)))
		s.log.InfoContext(ctx, "collected dead checkpoints", "count", len(dead), "layers_removed", removed)
		if len(dead) < 100 {
			return nil
		}
	}
}

// removeUnused removes from the layer store the layers among digests that
// no record uses, and returns how many went.
func (s *Server) removeUnused(ctx context.Context, digests []string) (int, error) {
	s.layerMu.Lock()
	defer s.layerMu.Unlock()
	var unused []string
	seen := map[string]bool{}
	for _, d := range digests {
		if seen[d] {
			continue
		}
		seen[d] = true
		inUse, err := s.store.LayerInUse(ctx, d)
		if err != nil {
			return 0, err
		}
		if !inUse {
			unused = append(unused, d)
		}
	}
	if len(unused) == 0 || s.cfg.Layers == nil || s.cfg.KeepLayerObjects {
		return 0, nil
	}
	st, err := s.cfg.Layers.Remove(ctx, unused)
	if err != nil {
		return 0, err
	}
	s.log.InfoContext(ctx, "removed unused snapshot layers", "layers", st.Layers, "chunks", st.Chunks, "bytes", st.Bytes,
		"manifests_scanned", st.Scanned)
	return st.Layers, nil
}

// Layers dsec makes for its own needs go once nothing uses them: a fork's
// snapshot layer (fork/<parent>:<fork id>) when no copy of the fork runs
// on it any more and no snapshot stacks on it, after ForkLayerGrace (a
// fork in flight has packed its layer before its copies are recorded);
// a Dockerfile step's cache layer (build-cache/<key>:1) when no layer
// stacks on it (a build's result kept as layers does) and no build has
// used it for BuildCacheTTL (a cache hit renews it).
const (
	DefaultForkLayerGrace = 10 * time.Minute
	DefaultBuildCacheTTL  = 7 * 24 * time.Hour
	collectLayersPerRound = 100
)

// collectLayers removes unused fork and build-cache layers: their records,
// then the objects nothing else uses. It returns how many records went.
func (s *Server) collectLayers(ctx context.Context) (int, error) {
	ttl := s.cfg.BuildCacheTTL
	if ttl <= 0 {
		ttl = DefaultBuildCacheTTL
	}
	grace := s.cfg.ForkLayerGrace
	if grace <= 0 {
		grace = DefaultForkLayerGrace
	}
	now := time.Now()
	total := 0
	for _, c := range []struct {
		prefix string
		before time.Time
	}{
		{forkLayerPrefix, now.Add(-grace)},
		{buildCachePrefix, now.Add(-ttl)},
	} {
		for {
			list, err := s.store.UnusedLayers(ctx, c.prefix, c.before, collectLayersPerRound)
			if err != nil {
				return total, err
			}
			if len(list) == 0 {
				break
			}
			var candidates []string
			for _, l := range list {
				if err := s.store.DeleteLayer(ctx, l.Tenant, l.Name, l.Tag, l.Digest); err != nil {
					return total, err
				}
				candidates = append(candidates, l.Digest)
				candidates = append(candidates, l.Parents...)
			}
			total += len(list)
			s.layers.forget()
			removed, err := s.removeUnused(ctx, candidates)
			if err != nil {
				return total, err
			}
			s.log.Info("collected unused layers", "prefix", c.prefix, "records", len(list), "layers_removed", removed)
			if len(list) < collectLayersPerRound {
				break
			}
		}
	}
	return total, nil
}
