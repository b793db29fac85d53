// Package posix is a blob.Store in a directory, for a file system that
// several nodes mount together (3FS, JuiceFS, CephFS, NFS) or for one
// node's own disk (package local wraps it so).
//
// An object is the file <dir>/<key>. Puts write a temporary file under
// <dir>/.tmp named by node, process and a random suffix, fsync it, and
// rename it into place: on every one of those file systems a rename within
// one file system is atomic, so readers on any node see a whole object or
// none. Only close-to-open consistency is assumed (a reader opens the file
// after the writer's rename). The store must never remove another node's
// temporary file while it may still be written: it sweeps only its own
// node's leftovers, or, when it owns the directory alone, any old enough.
package posix

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Options configure a Store.
type Options struct {
	// NodeID names this node in temporary file names; the host name by
	// default.
	NodeID string
	// Exclusive says no other node writes to the directory, so every stale
	// temporary file may be swept, not only this node's.
	Exclusive bool
}

// staleTemp is how old a temporary file must be before it is taken for
// the leftover of a crash rather than a put in progress.
const staleTemp = 24 * time.Hour

// Store is a blob.Store in a directory.
type Store struct {
	dir    string
	prefix string // of this node's temporary files
}

var _ blob.Store = (*Store)(nil)

// Open opens (creating it if need be) the store in dir and sweeps stale
// temporary files.
func Open(dir string, opts Options) (*Store, error) {
	if opts.NodeID == "" {
		opts.NodeID, _ = os.Hostname()
	}
	node := strings.Map(func(r rune) rune {
		if r == '-' || r == '/' || r == '.' {
			return '_'
		}
		return r
	}, opts.NodeID)
	s := &Store{dir: dir, prefix: node + "-"}
	if err := os.MkdirAll(s.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("open blob store %s: %w", dir, err)
	}
	entries, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return nil, fmt.Errorf("open blob store %s: %w", dir, err)
	}
	for _, e := range entries {
		if !opts.Exclusive && !strings.HasPrefix(e.Name(), s.prefix) {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleTemp {
			os.Remove(filepath.Join(s.tmpDir(), e.Name()))
		}
	}
	return s, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) tmpDir() string { return filepath.Join(s.dir, ".tmp") }

func (s *Store) path(key string) (string, error) {
	if err := blob.CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.dir, filepath.FromSlash(key)), nil
}

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	final, err := s.path(key)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if size < 0 {
		return fmt.Errorf("put %s: %w", key, errdefs.Invalid("negative size %d", size))
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(s.tmpDir(), fmt.Sprintf("%s%d-%s", s.prefix, os.Getpid(), hex.EncodeToString(rnd[:])))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	n, err := io.Copy(f, &ctxReader{ctx: ctx, r: io.LimitReader(r, size+1)})
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if n != size {
		return fmt.Errorf("put %s: %w", key, errdefs.Invalid("got %d bytes, want %d", n, size))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("put %s: sync: %w", key, err)
	}
	err = f.Close()
	f = nil
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// ctxReader stops a long copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFound("object %s", key)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	n, err := blob.CheckRange(key, st.Size(), off, length)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &rangeReader{r: io.NewSectionReader(f, off, n), f: f, want: n}, nil
}

// rangeReader reads a file range and fails, rather than ending early, if
// the file was shorter than promised.
type rangeReader struct {
	r    io.Reader
	f    *os.File
	want int64
	got  int64
}

func (r *rangeReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.got += int64(n)
	if errors.Is(err, io.EOF) && r.got < r.want {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (r *rangeReader) Close() error { return r.f.Close() }

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	p, err := s.path(key)
	if err != nil {
		return blob.Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return blob.Info{}, errdefs.NotFound("object %s", key)
	}
	if err != nil {
		return blob.Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	if !st.Mode().IsRegular() {
		return blob.Info{}, errdefs.NotFound("object %s", key)
	}
	return blob.Info{Key: key, Size: st.Size()}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	p, err := s.path(key)
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// List implements blob.Store.
func (s *Store) List(ctx context.Context, prefix string, fn func(blob.Info) error) error {
	// Walk only the deepest directory the prefix names.
	start := s.dir
	if i := strings.LastIndexByte(prefix, '/'); i > 0 {
		start = filepath.Join(s.dir, filepath.FromSlash(prefix[:i]))
	}
	var infos []blob.Info
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && p != start {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(s.dir, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) || blob.CheckKey(key) != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		infos = append(infos, blob.Info{Key: key, Size: info.Size()})
		return ctx.Err()
	})
	if err != nil {
		return fmt.Errorf("list %q: %w", prefix, err)
	}
	slices.SortFunc(infos, func(a, b blob.Info) int { return strings.Compare(a.Key, b.Key) })
	for _, info := range infos {
		if err := fn(info); err != nil {
			return err
		}
	}
	return nil
}
