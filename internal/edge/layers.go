package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/layer"
)

// Layer modes: how a node gets a chunked layer's data.
const (
	// ModeOnDemand reads the blob through blobfs, fetching chunks as they
	// are touched (the default).
	ModeOnDemand = "ondemand"
	// ModeFull fetches the whole blob to node disk before mounting.
	ModeFull = "full"
)

// StoreLayersConfig configures StoreLayers.
type StoreLayersConfig struct {
	Store *layer.Store
	// Dir is node-local: meta/<hex>.erofs (metadata images), blob/<hex>
	// (complete blobs), manifests/<hex>.json and .prefetch (what blobfs
	// serves).
	Dir string
	// Blobfs is where the node's blobfs is mounted; "" means no blobfs:
	// every blob is fetched whole.
	Blobfs string
	// Mode is ModeOnDemand or ModeFull.
	Mode string
	// DirectBelow: blobs at most this big are fetched whole and mounted
	// without FUSE (one round of fetches beats many small ones for them).
	DirectBelow int64
	Logger      *slog.Logger
}

// StoreLayers makes layers of a shared layer.Store available on this node:
// the metadata image is fetched whole to node disk, the data blob either
// served on demand by blobfs or fetched whole (small blobs, ModeFull, or a
// blob already complete on disk).
type StoreLayers struct {
	cfg StoreLayersConfig
	log *slog.Logger

	mu       sync.Mutex
	inflight map[string]*layerFetch
	// ready holds the layers this node has all it needs of: creates from
	// cached layers touch neither the store nor the disk.
	ready map[string]backend.Layer

	fetched atomic.Int64 // bytes read from the store for whole parts
}

type layerFetch struct {
	done chan struct{}
	l    backend.Layer
	err  error
}

var _ Layers = (*StoreLayers)(nil)

// NewStoreLayers prepares the node's layer directories.
func NewStoreLayers(cfg StoreLayersConfig) (*StoreLayers, error) {
	if cfg.Mode == "" {
		cfg.Mode = ModeOnDemand
	}
	if cfg.Mode != ModeOnDemand && cfg.Mode != ModeFull {
		return nil, errdefs.Invalid("layer mode %q: want %s or %s", cfg.Mode, ModeOnDemand, ModeFull)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for _, d := range []string{"meta", "blob", "manifests"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("node layers: %w", err)
		}
	}
	return &StoreLayers{cfg: cfg, log: cfg.Logger, inflight: map[string]*layerFetch{}, ready: map[string]backend.Layer{}}, nil
}

// Cached implements CachedLayers: the layers whose metadata image is on
// this node's disk, which a create uses without going to the store (their
// data is on disk too, or served by blobfs from its chunk cache).
func (s *StoreLayers) Cached() []string {
	ents, _ := os.ReadDir(filepath.Join(s.cfg.Dir, "meta"))
	out := []string{}
	for _, e := range ents {
		h, ok := strings.CutSuffix(e.Name(), ".erofs")
		if !ok {
			continue // a fetch under way
		}
		if d := "sha256:" + h; e.Type().IsRegular() {
			if _, err := contentdigest.Parse(d); err == nil {
				out = append(out, d)
			}
		}
	}
	return out
}

// ManifestDir is where blobfs finds the manifests of the layers it serves.
func (s *StoreLayers) ManifestDir() string { return filepath.Join(s.cfg.Dir, "manifests") }

// FetchedBytes is what whole-part fetches read from the store so far
// (compressed); blobfs counts its own.
func (s *StoreLayers) FetchedBytes() int64 { return s.fetched.Load() }

// Fetch implements Layers. Concurrent fetches of one layer share one.
func (s *StoreLayers) Fetch(ctx context.Context, digest string) (backend.Layer, error) {
	h, err := contentdigest.Parse(digest)
	if err != nil {
		return backend.Layer{}, err
	}
	s.mu.Lock()
	if l, ok := s.ready[h]; ok {
		s.mu.Unlock()
		return l, nil
	}
	if f := s.inflight[h]; f != nil {
		s.mu.Unlock()
		select {
		case <-f.done:
			return f.l, f.err
		case <-ctx.Done():
			return backend.Layer{}, ctx.Err()
		}
	}
	f := &layerFetch{done: make(chan struct{})}
	s.inflight[h] = f
	s.mu.Unlock()
	f.l, f.err = s.fetch(context.WithoutCancel(ctx), digest, h)
	s.mu.Lock()
	delete(s.inflight, h)
	if f.err == nil {
		s.ready[h] = f.l
	}
	s.mu.Unlock()
	close(f.done)
	return f.l, f.err
}

func (s *StoreLayers) fetch(ctx context.Context, digest, h string) (backend.Layer, error) {
	metaPath := filepath.Join(s.cfg.Dir, "meta", h+".erofs")
	manPath := filepath.Join(s.ManifestDir(), h+".json")
	m, err := s.manifest(ctx, digest, manPath)
	if err != nil {
		return backend.Layer{}, err
	}
	if _, err := os.Stat(metaPath); errors.Is(err, os.ErrNotExist) {
		n, err := s.cfg.Store.FetchPart(ctx, &m.Meta, metaPath)
		s.fetched.Add(n)
		if err != nil {
			return backend.Layer{}, fmt.Errorf("fetch layer %s metadata: %w", digest, err)
		}
	}
	l := backend.Layer{Digest: digest, Path: metaPath}
	if m.Blob == nil {
		return l, nil
	}
	blobPath := filepath.Join(s.cfg.Dir, "blob", h)
	if _, err := os.Stat(blobPath); err == nil {
		l.Device = blobPath
		return l, nil
	}
	if s.cfg.Mode == ModeFull || s.cfg.Blobfs == "" || m.Blob.Size <= s.cfg.DirectBelow {
		n, err := s.cfg.Store.FetchPart(ctx, m.Blob, blobPath)
		s.fetched.Add(n)
		if err != nil {
			return backend.Layer{}, fmt.Errorf("fetch layer %s blob: %w", digest, err)
		}
		l.Device = blobPath
		return l, nil
	}
	s.fetchPrefetchList(ctx, digest, h)
	l.Device, l.OnDemand = filepath.Join(s.cfg.Blobfs, h), true
	return l, nil
}

// manifest returns the layer's manifest, from node disk if it was fetched
// before, and leaves a verified copy there for blobfs.
func (s *StoreLayers) manifest(ctx context.Context, digest, path string) (*layer.Manifest, error) {
	if b, err := os.ReadFile(path); err == nil {
		if m, err := layer.ParseManifest(digest, b); err == nil {
			return m, nil
		}
	}
	m, raw, err := s.cfg.Store.Manifest(ctx, digest)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(path, raw); err != nil {
		return nil, fmt.Errorf("layer %s: %w", digest, err)
	}
	return m, nil
}

// fetchPrefetchList copies the layer's hot-chunk list, if the store has
// one, next to its manifest for blobfs.
func (s *StoreLayers) fetchPrefetchList(ctx context.Context, digest, h string) {
	b, err := blob.ReadAll(ctx, s.cfg.Store.Blobs(), layer.PrefetchKey(digest))
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.log.WarnContext(ctx, "prefetch list", "layer", digest, "err", err)
		}
		return
	}
	if err := writeFileAtomic(filepath.Join(s.ManifestDir(), h+".prefetch"), b); err != nil {
		s.log.WarnContext(ctx, "prefetch list", "layer", digest, "err", err)
	}
}

func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))+"-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// CopyAside copies a sandbox's changes aside for a fork: the directories are squashed (one is
// copied as it is, whiteouts and xattrs kept) into a scratch directory
// beside the store's own.
func (s *StoreLayers) CopyAside(ctx context.Context, dirs []string) (string, error) {
	tmp, err := os.MkdirTemp(s.cfg.Dir, "aside-")
	if err != nil {
		return "", err
	}
	if err := layer.Squash(ctx, dirs, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("copy changes aside: %w", err)
	}
	return tmp, nil
}

// Pack stores a snapshot (Config.Packer): one directory is built as it is; several are
// squashed first into a scratch directory beside the store's own.
func (s *StoreLayers) Pack(ctx context.Context, dirs []string) (SnapshotResult, error) {
	src := dirs[0]
	if len(dirs) > 1 {
		tmp, err := os.MkdirTemp(s.cfg.Dir, "squash-")
		if err != nil {
			return SnapshotResult{}, err
		}
		defer os.RemoveAll(tmp)
		if err := layer.Squash(ctx, dirs, tmp); err != nil {
			return SnapshotResult{}, err
		}
		src = tmp
	}
	d, err := s.cfg.Store.Build(ctx, src)
	if err != nil {
		return SnapshotResult{}, err
	}
	return SnapshotResult{Digest: d.Digest, Size: d.Size}, nil
}

// PackDisk implements DiskPacker.
func (s *StoreLayers) PackDisk(ctx context.Context, path string) (SnapshotResult, error) {
	d, err := s.cfg.Store.PutDisk(ctx, path)
	if err != nil {
		return SnapshotResult{}, err
	}
	return SnapshotResult{Digest: d.Digest, Size: d.Size}, nil
}
