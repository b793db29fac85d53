package blobfs

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/layer"
)

// Source is where chunks come from: the shared layer store.
type Source interface {
	// ReadChunk returns the chunk's verified, uncompressed bytes and how
	// many bytes were read from the store.
	ReadChunk(ctx context.Context, c layer.Chunk) ([]byte, int64, error)
}

// Cache is the node's content-addressed chunk cache: dir/<hh>/<hex> holds
// a chunk's uncompressed bytes. Chunks enter it only after their digest was
// checked; chunks found on disk at start are checked again on first use.
// Beyond Max bytes the least recently used chunks are evicted. Concurrent
// misses of one chunk fetch it once.
type Cache struct {
	dir string
	max int64
	src Source
	m   *metrics

	mu sync.Mutex
	// entries and lru are guarded by mu; lru's front is the most recent.
	entries map[string]*entry
	lru     *list.List
	size    int64
	// inflight merges concurrent fetches of one chunk.
	inflight map[string]*fetch
}

type entry struct {
	digest   string
	size     int64
	verified bool
	elem     *list.Element
}

type fetch struct {
	done chan struct{}
	err  error
}

// OpenCache opens the cache in dir, indexing the chunks already there.
func OpenCache(dir string, max int64, src Source, m *metrics) (*Cache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open chunk cache: %w", err)
	}
	c := &Cache{dir: dir, max: max, src: src, m: m, entries: map[string]*entry{}, lru: list.New(), inflight: map[string]*fetch{}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := d.Name()
		if _, perr := contentdigest.Parse("sha256:" + name); perr != nil {
			os.Remove(p) // a temporary file a crash left
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		e := &entry{digest: "sha256:" + name, size: info.Size()}
		e.elem = c.lru.PushBack(e)
		c.entries[e.digest] = e
		c.size += e.size
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("open chunk cache: %w", err)
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	c.m.cacheBytes.Set(float64(c.size))
	return c, nil
}

func (c *Cache) path(digest string) string {
	h := digest[len("sha256:"):]
	return filepath.Join(c.dir, h[:2], h)
}

// Size is the bytes the cache holds.
func (c *Cache) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size
}

// ReadAt fills p from the chunk at offset off, fetching the chunk if it
// is not cached. It fills all of p or fails.
func (c *Cache) ReadAt(ctx context.Context, ch layer.Chunk, p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > ch.Size {
		return fmt.Errorf("read %d bytes at %d of chunk %s (%d bytes): out of range", len(p), off, ch.Digest, ch.Size)
	}
	for attempt := 0; ; attempt++ {
		hit, err := c.ensure(ctx, ch)
		if err != nil {
			return err
		}
		if hit {
			c.m.hits.Inc()
		}
		err = c.readFile(ch, p, off)
		if err == nil {
			return nil
		}
		// Evicted between ensure and open (a cache far smaller than
		// the reads in flight), or found corrupt: again, a few times.
		if attempt == 4 {
			return err
		}
	}
}

// Has reports whether the chunk is cached.
func (c *Cache) Has(digest string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[digest] != nil
}

// ensure makes the chunk present (and verified) in the cache, and reports
// whether it already was.
func (c *Cache) ensure(ctx context.Context, ch layer.Chunk) (bool, error) {
	c.mu.Lock()
	if e := c.entries[ch.Digest]; e != nil {
		c.lru.MoveToFront(e.elem)
		if e.verified {
			c.mu.Unlock()
			return true, nil
		}
		c.mu.Unlock()
		if c.verify(e) {
			return true, nil
		}
		c.mu.Lock()
	}
	if f := c.inflight[ch.Digest]; f != nil {
		c.mu.Unlock()
		select {
		case <-f.done:
			return false, f.err
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	f := &fetch{done: make(chan struct{})}
	c.inflight[ch.Digest] = f
	c.mu.Unlock()

	// The fetch outlives a canceled reader: others may wait for it.
	f.err = c.fetch(context.WithoutCancel(ctx), ch)
	c.mu.Lock()
	delete(c.inflight, ch.Digest)
	c.mu.Unlock()
	close(f.done)
	return false, f.err
}

// verify checks a chunk found on disk at start against its digest, and
// drops it if it does not match.
func (c *Cache) verify(e *entry) bool {
	data, err := os.ReadFile(c.path(e.digest))
	ok := err == nil
	if ok {
		sum := sha256.Sum256(data)
		ok = "sha256:"+hex.EncodeToString(sum[:]) == e.digest
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok {
		e.verified = true
	} else if c.entries[e.digest] == e {
		c.removeLocked(e)
	}
	return ok
}

func (c *Cache) fetch(ctx context.Context, ch layer.Chunk) error {
	c.m.misses.Inc()
	timer := c.m.startFetch()
	data, n, err := c.src.ReadChunk(ctx, ch)
	timer()
	if err != nil {
		c.m.fetchErrors.Inc()
		return err
	}
	c.m.fetchedBytes.Add(float64(n))
	c.m.fetchedRaw.Add(float64(len(data)))
	c.m.fetchedChunks.Inc()
	p := c.path(ch.Digest)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".chunk-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("cache chunk %s: %w", ch.Digest, err)
	}
	c.mu.Lock()
	if old := c.entries[ch.Digest]; old != nil {
		c.removeEntryLocked(old)
	}
	e := &entry{digest: ch.Digest, size: int64(len(data)), verified: true}
	e.elem = c.lru.PushFront(e)
	c.entries[e.digest] = e
	c.size += e.size
	c.evictLocked()
	c.m.cacheBytes.Set(float64(c.size))
	c.mu.Unlock()
	return nil
}

func (c *Cache) readFile(ch layer.Chunk, p []byte, off int64) error {
	f, err := os.Open(c.path(ch.Digest))
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(p, off); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("chunk %s is short in the cache", ch.Digest)
		}
		return err
	}
	return nil
}

// evictLocked drops least recently used chunks until the cache fits its
// cap. A chunk being read stays readable: its file is open.
//
// Preconditions: c.mu is held.
func (c *Cache) evictLocked() {
	for c.size > c.max && c.lru.Len() > 1 {
		e := c.lru.Back().Value.(*entry)
		c.removeLocked(e)
		c.m.evictions.Inc()
	}
}

// Preconditions: c.mu is held.
func (c *Cache) removeLocked(e *entry) {
	c.removeEntryLocked(e)
	os.Remove(c.path(e.digest))
	c.m.cacheBytes.Set(float64(c.size))
}

// Preconditions: c.mu is held.
func (c *Cache) removeEntryLocked(e *entry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.digest)
	c.size -= e.size
}
