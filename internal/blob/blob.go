// Package blob defines the object store that layer data lives in: a flat
// namespace of immutable objects, written whole and read by byte range.
// The layer format (package layer) keeps its chunks, metadata images and
// manifests there; blobfs reads chunks from it on demand. Several nodes
// share one store.
//
// Implementations live in sub-packages: local (a directory on this node,
// the default), posix (a directory on a mount shared by several nodes:
// 3FS, JuiceFS, CephFS, NFS) and s3 (any S3-compatible service). All pass
// the behaviour suite in blobtest.
//
// A Store must never expose a partly written object: an object is either
// absent or complete. It must never interpret the bytes it keeps
// (compression and verification are the layer format's business).
package blob

import (
	"context"
	"io"
	"strings"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// Store keeps immutable objects by key. Safe for concurrent use, also by
// several processes and nodes sharing the same backing storage.
type Store interface {
	// Put stores size bytes read from r under key. The object appears
	// complete or not at all; putting a key that exists replaces it (the
	// layer format only ever puts content-addressed keys, so a replacement
	// carries the same bytes). A reader that ends before size bytes, or
	// gives more, is an error and stores nothing.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get reads length bytes of the object from offset off; length < 0
	// reads to the end. A missing object is errdefs.ErrNotFound; a range
	// past the end is errdefs.ErrInvalid. The reader returns exactly the
	// bytes asked for or an error.
	Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error)
	// Stat describes the object, or is errdefs.ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes the object; deleting a missing one succeeds.
	Delete(ctx context.Context, key string) error
	// List calls fn for every object whose key starts with prefix, in
	// key order; an error from fn stops the walk and is returned.
	List(ctx context.Context, prefix string, fn func(Info) error) error
}

// Info describes a stored object.
type Info struct {
	Key  string
	Size int64
}

// maxKeyLen bounds a key: S3 allows 1024 bytes, file systems 255 per
// component; ours are short and content-addressed.
const maxKeyLen = 512

// CheckKey validates a key: 1 to 512 bytes of [a-z0-9._-] in components
// separated by '/', none empty, "." or "..", and none starting with '.'
// (the directory stores keep their temporary files under such names).
func CheckKey(key string) error {
	if key == "" || len(key) > maxKeyLen {
		return errdefs.Invalid("object key %q: want 1 to %d bytes", key, maxKeyLen)
	}
	for _, c := range strings.Split(key, "/") {
		if c == "" || c[0] == '.' || len(c) > 200 {
			return errdefs.Invalid("object key %q: empty, dot-led or over-long component", key)
		}
		for i := 0; i < len(c); i++ {
			b := c[i]
			if !('a' <= b && b <= 'z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
				return errdefs.Invalid("object key %q: only [a-z0-9._-] and '/' are allowed", key)
			}
		}
	}
	return nil
}

// CheckRange validates a range request against an object of size bytes and
// returns the length to read.
func CheckRange(key string, size, off, length int64) (int64, error) {
	if off < 0 || off > size {
		return 0, errdefs.Invalid("object %s: offset %d outside its %d bytes", key, off, size)
	}
	if length < 0 {
		return size - off, nil
	}
	if off+length > size {
		return 0, errdefs.Invalid("object %s: range %d+%d past its %d bytes", key, off, length, size)
	}
	return length, nil
}

// ReadAll reads a whole object into memory. Callers use it only for small
// objects (chunks, manifests).
func ReadAll(ctx context.Context, s Store, key string) ([]byte, error) {
	rc, err := s.Get(ctx, key, 0, -1)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}
