// Package blobfs is the node's FUSE file system of layer blobs: one mount
// per node in which every chunked layer's data blob appears as a read-only
// file, <mountpoint>/<digest hex>, that EROFS mounts as its device=. A read
// fetches the chunks it touches from the shared layer store into the
// node's chunk cache (verified against their digests, concurrent misses
// merged, capped with LRU eviction) and answers from there. Layers may name
// hot chunks to prefetch; every layer's first-touched chunks are recorded
// so a first run can produce such a list.
//
// blobfs must never return a short read inside a file (EROFS would take
// the missing bytes for zeros): a read it cannot serve whole fails with
// EIO. It must never serve bytes that did not match their digest. FUSE
// passthrough stays disabled: EROFS over a passthrough file does not work.
package blobfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/layer"
)

// Config configures a blobfs.
type Config struct {
	// Mountpoint is where the file system appears.
	Mountpoint string
	// ManifestDir holds the manifests of the layers blobfs serves,
	// <hex>.json (written there by the edge before it mounts the layer),
	// and optional hot-chunk lists, <hex>.prefetch (a JSON array of chunk
	// indices).
	ManifestDir string
	// CacheDir holds the chunk cache; CacheMax bounds it (bytes).
	CacheDir string
	CacheMax int64
	Source   Source
	// PrefetchParallel bounds concurrent prefetches per layer; 4 by
	// default.
	PrefetchParallel int
	Logger           *slog.Logger
}

// FS is a mounted blobfs.
type FS struct {
	cfg    Config
	cache  *Cache
	m      *metrics
	conn   *conn
	fd     int
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // prefetches

	mu sync.Mutex
	// layers maps a digest's hex to the layer served under that name;
	// nodes maps the node ids given to the kernel to the hex.
	layers map[string]*blobLayer
	nodes  map[uint64]string
}

// blobLayer is one served blob.
type blobLayer struct {
	hex     string
	blob    layer.Part
	offsets []int64

	mu sync.Mutex
	// touched marks the chunks read so far; order lists them in the order
	// of their first read.
	touched []bool
	order   []int
}

// newFS opens the chunk cache of a blobfs not yet serving.
func newFS(cfg Config) (*FS, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PrefetchParallel <= 0 {
		cfg.PrefetchParallel = 4
	}
	m := newMetrics()
	cache, err := OpenCache(cfg.CacheDir, cfg.CacheMax, cfg.Source, m)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.ManifestDir, 0o700); err != nil {
		return nil, fmt.Errorf("blobfs: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &FS{cfg: cfg, cache: cache, m: m, log: cfg.Logger.With("component", "blobfs"), fd: -1,
		ctx: ctx, cancel: cancel, layers: map[string]*blobLayer{}, nodes: map[uint64]string{}}, nil
}

// Mount mounts a blobfs served by this process. Unmount it with Close.
func Mount(cfg Config) (*FS, error) {
	f, err := newFS(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Mountpoint, 0o700); err != nil {
		return nil, fmt.Errorf("mount blobfs: %w", err)
	}
	fd, err := mountFUSE(cfg.Mountpoint)
	if err != nil {
		f.cancel()
		return nil, err
	}
	if err := f.serve(fd, false); err != nil {
		unix.Unmount(cfg.Mountpoint, unix.MNT_DETACH)
		unix.Close(fd)
		f.cancel()
		return nil, err
	}
	if err := pollHack(cfg.Mountpoint); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// serve serves the FUSE connection fd (resume: one a dead process served).
func (f *FS) serve(fd int, resume bool) error {
	c, err := serveConn(fd, f, resume)
	if err != nil {
		return err
	}
	f.fd, f.conn = fd, c
	go func() {
		<-c.done
		unix.Close(fd)
	}()
	return nil
}

// Close stops prefetches and unmounts. EROFS mounts still using blobfs
// files keep it busy (a lazily detached one until its last user is gone):
// Close retries for a few seconds, then gives up with an error and the
// file system still served.
func (f *FS) Close() error {
	f.cancel()
	f.wg.Wait()
	var err error
	for delay := 10 * time.Millisecond; delay < 5*time.Second; delay *= 2 {
		if err = f.unmount(); err == nil {
			return nil
		}
		time.Sleep(delay)
	}
	return fmt.Errorf("unmount blobfs: %w", err)
}

// unmount unmounts the file system if nothing uses it and waits until
// the connection has ended.
func (f *FS) unmount() error {
	if err := unix.Unmount(f.cfg.Mountpoint, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	select {
	case <-f.conn.done:
	case <-time.After(5 * time.Second):
		return errors.New("FUSE connection still open after the unmount")
	}
	return nil
}

// Unmount unmounts the file system if nothing uses it: one attempt,
// without Close's retries, so that a mount in use goes on serving as it
// was.
func (f *FS) Unmount() error {
	if err := f.unmount(); err != nil {
		return fmt.Errorf("unmount blobfs: %w", err)
	}
	f.cancel()
	f.wg.Wait()
	return nil
}

// Wait blocks until the file system is unmounted.
func (f *FS) Wait() { <-f.conn.done }

// Stats summarizes the counters.
func (f *FS) Stats() Stats {
	s := f.m.stats()
	s.CacheBytes = f.cache.Size()
	return s
}

// Registry is the Prometheus registry of blobfs's metrics.
func (f *FS) Registry() *prometheus.Registry { return f.m.reg }

// Touched returns the chunks of a layer's blob read so far, in the order
// of their first read: a hot list for prefetching.
func (f *FS) Touched(hex string) ([]int, bool) {
	f.mu.Lock()
	l := f.layers[hex]
	f.mu.Unlock()
	if l == nil {
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.order...), true
}

// layer returns the served layer named hex, loading its manifest on first
// use.
func (f *FS) layer(hex string) (*blobLayer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.layers[hex]; l != nil {
		return l, nil
	}
	if _, err := contentdigest.Parse("sha256:" + hex); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(f.cfg.ManifestDir, hex+".json"))
	if err != nil {
		return nil, err
	}
	m, err := layer.ParseManifest("sha256:"+hex, b)
	if err != nil {
		return nil, err
	}
	if m.Blob == nil {
		return nil, os.ErrNotExist
	}
	l := &blobLayer{hex: hex, blob: *m.Blob, offsets: m.Blob.Offsets(), touched: make([]bool, len(m.Blob.Chunks))}
	f.layers[hex] = l
	f.nodes[nodeID(hex)] = hex
	f.startPrefetch(l)
	return l, nil
}

// startPrefetch fetches the layer's hot chunks in the background.
func (f *FS) startPrefetch(l *blobLayer) {
	b, err := os.ReadFile(filepath.Join(f.cfg.ManifestDir, l.hex+".prefetch"))
	if err != nil {
		return
	}
	var hot []int
	if err := json.Unmarshal(b, &hot); err != nil {
		f.log.Warn("bad prefetch list", "layer", l.hex, "err", err)
		return
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		sem := make(chan struct{}, f.cfg.PrefetchParallel)
		var wg sync.WaitGroup
		for _, i := range hot {
			if i < 0 || i >= len(l.blob.Chunks) || f.ctx.Err() != nil {
				continue
			}
			c := l.blob.Chunks[i]
			if f.cache.Has(c.Digest) {
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if _, err := f.cache.ensure(f.ctx, c); err == nil {
					f.m.prefetched.Inc()
				}
			}()
		}
		wg.Wait()
	}()
}

// read fills dest from the blob at off and returns how many bytes it
// filled: all of dest, or up to the end of the blob.
func (f *FS) read(ctx context.Context, l *blobLayer, dest []byte, off int64) (int, error) {
	if off >= l.blob.Size {
		return 0, nil
	}
	n := int(min(int64(len(dest)), l.blob.Size-off))
	for done := 0; done < n; {
		pos := off + int64(done)
		i := layer.ChunkAt(l.offsets, pos)
		c := l.blob.Chunks[i]
		within := pos - l.offsets[i]
		k := int(min(int64(n-done), c.Size-within))
		if err := f.cache.ReadAt(ctx, c, dest[done:done+k], within); err != nil {
			return 0, err
		}
		l.touch(i)
		done += k
	}
	f.m.readBytes.Add(float64(n))
	return n, nil
}

func (l *blobLayer) touch(i int) {
	l.mu.Lock()
	if !l.touched[i] {
		l.touched[i] = true
		l.order = append(l.order, i)
	}
	l.mu.Unlock()
}
