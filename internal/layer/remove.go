package layer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// RemoveStats counts what Remove deleted.
type RemoveStats struct {
	Layers int
	// Chunks were named by no other layer; Bytes are their compressed
	// sizes.
	Chunks int
	Bytes  int64
	// Scanned counts the other manifests read to find shared chunks.
	Scanned int
}

// Remove deletes layers from the store: their manifests and hot lists, and
// every chunk of theirs that no other manifest in the store names.
// Manifests go first, so a crash part-way leaves chunks that nothing
// names, never a manifest whose chunks are gone. A layer the store lacks
// is skipped. If another manifest cannot be read, nothing is deleted.
//
// Preconditions: no layer is being stored meanwhile. A build that finds a
// chunk already present does not store it again, so a build that overlaps
// Remove could write a manifest naming a chunk Remove deletes: the caller
// serialises Remove with every writer of the store.
func (s *Store) Remove(ctx context.Context, digests []string) (RemoveStats, error) {
	var st RemoveStats
	dead := map[string]bool{}
	chunks := map[string]bool{}
	for _, d := range digests {
		m, _, err := s.Manifest(ctx, d)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return st, fmt.Errorf("remove layer %s: %w", d, err)
		}
		dead[d] = true
		for _, p := range []*Part{&m.Meta, m.Blob} {
			if p == nil {
				continue
			}
			for _, c := range p.Chunks {
				chunks[c.Digest] = true
			}
		}
	}
	if len(dead) == 0 {
		return st, nil
	}
	// Keep every chunk another manifest names.
	err := s.blobs.List(ctx, "layers/sha256/", func(info blob.Info) error {
		d := contentdigest.Prefix + strings.TrimPrefix(info.Key, "layers/sha256/")
		if dead[d] || len(chunks) == 0 {
			return nil
		}
		m, _, err := s.Manifest(ctx, d)
		if err != nil {
			return fmt.Errorf("read manifest %s: %w", d, err)
		}
		st.Scanned++
		for _, p := range []*Part{&m.Meta, m.Blob} {
			if p == nil {
				continue
			}
			for _, c := range p.Chunks {
				delete(chunks, c.Digest)
			}
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("remove layers: %w", err)
	}
	for d := range dead {
		if err := s.blobs.Delete(ctx, PrefetchKey(d)); err != nil {
			return st, fmt.Errorf("remove layer %s: %w", d, err)
		}
		if err := s.blobs.Delete(ctx, ManifestKey(d)); err != nil {
			return st, fmt.Errorf("remove layer %s: %w", d, err)
		}
		st.Layers++
	}
	for c := range chunks {
		key := ChunkKey(c)
		if info, err := s.blobs.Stat(ctx, key); err == nil {
			st.Bytes += info.Size
		}
		if err := s.blobs.Delete(ctx, key); err != nil {
			return st, fmt.Errorf("remove chunk %s: %w", c, err)
		}
		st.Chunks++
	}
	return st, nil
}
