package layer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"github.com/dsec-project/dsec/internal/blob"
	"github.com/dsec-project/dsec/internal/contentdigest"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// erofsChunkSize is the chunk size given to mkfs.erofs: every regular
// file's data goes to the blob device in 4 KiB blocks, identical blocks
// stored once within the image. (The store's chunks are content-defined
// and larger: see cdc.go.)
const erofsChunkSize = 4096

// Store keeps layers in the chunked format (see Manifest) in a blob.Store
// shared by the cluster. Safe for concurrent use.
type Store struct {
	blobs  blob.Store
	tmpDir string
	enc    *zstd.Encoder
	dec    *zstd.Decoder
	// Parallel bounds concurrent chunk transfers; 8 by default.
	Parallel int
}

// Desc describes a stored layer.
type Desc struct {
	// Digest is the manifest's "sha256:<hex>".
	Digest string
	// Size is the layer's uncompressed size (metadata image plus blob).
	Size int64
	// Chunks counts the chunks; NewChunks those the store lacked, and
	// StoredBytes their compressed size.
	Chunks, NewChunks int
	StoredBytes       int64
}

// NewStore returns a layer store over blobs; builds use tmpDir (on a
// disk with room for a layer's image) for their scratch files.
func NewStore(blobs blob.Store, tmpDir string) (*Store, error) {
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return nil, fmt.Errorf("layer store: %w", err)
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(4*cdcMax))
	if err != nil {
		return nil, err
	}
	return &Store{blobs: blobs, tmpDir: tmpDir, enc: enc, dec: dec, Parallel: 8}, nil
}

// Blobs is the object store underneath.
func (s *Store) Blobs() blob.Store { return s.blobs }

// ChunkKey and ManifestKey are where a chunk and a manifest live in the
// object store. Chunks fan out over 256 prefixes so that directory stores
// keep directories small.
func ChunkKey(digest string) string {
	h := digest[len(contentdigest.Prefix):]
	return "chunks/sha256/" + h[:2] + "/" + h
}

// ManifestKey is the object key of a layer's manifest.
func ManifestKey(digest string) string { return "layers/sha256/" + digest[len(contentdigest.Prefix):] }

// Build makes a chunked layer of srcDir (mkfs.erofs --chunksize
// --blobdev, run as root to keep whiteouts and trusted xattrs) and stores
// it. The same tree always gives the same digest.
func (s *Store) Build(ctx context.Context, srcDir string) (Desc, error) {
	work, err := os.MkdirTemp(s.tmpDir, "build-")
	if err != nil {
		return Desc{}, fmt.Errorf("build layer of %s: %w", srcDir, err)
	}
	defer os.RemoveAll(work)
	meta, data := filepath.Join(work, "meta.erofs"), filepath.Join(work, "blob")
	if err := buildChunked(ctx, srcDir, meta, data); err != nil {
		return Desc{}, fmt.Errorf("build layer of %s: %w", srcDir, err)
	}
	d, err := s.putFiles(ctx, meta, data)
	if err != nil {
		return Desc{}, fmt.Errorf("build layer of %s: %w", srcDir, err)
	}
	return d, nil
}

// ImportImage stores a finished EROFS image (an upload) as a whole-image
// layer: no blob, the image is the metadata part. At most limit bytes are
// read; a larger image is errdefs.ErrTooLarge.
func (s *Store) ImportImage(ctx context.Context, r io.Reader, limit int64) (Desc, error) {
	f, err := os.CreateTemp(s.tmpDir, "import-*.erofs")
	if err != nil {
		return Desc{}, fmt.Errorf("import layer: %w", err)
	}
	defer os.Remove(f.Name())
	n, err := copyContext(ctx, f, io.LimitReader(r, limit+1), make([]byte, 1<<20))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Desc{}, fmt.Errorf("import layer: %w", err)
	}
	if n > limit {
		return Desc{}, fmt.Errorf("import layer: image larger than %d bytes: %w", limit, errdefs.ErrTooLarge)
	}
	img, err := os.Open(f.Name())
	if err != nil {
		return Desc{}, fmt.Errorf("import layer: %w", err)
	}
	ok := IsEROFS(img)
	img.Close()
	if !ok {
		return Desc{}, errdefs.Invalid("not an EROFS image")
	}
	d, err := s.putFiles(ctx, f.Name(), "")
	if err != nil {
		return Desc{}, fmt.Errorf("import layer: %w", err)
	}
	return d, nil
}

// putFiles stores a metadata image and its blob (if any) and the manifest
// naming them.
func (s *Store) putFiles(ctx context.Context, meta, data string) (Desc, error) {
	var d Desc
	m := &Manifest{Version: ManifestVersion}
	mp, err := s.putPart(ctx, meta, &d)
	if err != nil {
		return Desc{}, err
	}
	m.Meta = *mp
	if data != "" {
		if st, err := os.Stat(data); err == nil && st.Size() > 0 {
			if m.Blob, err = s.putPart(ctx, data, &d); err != nil {
				return Desc{}, err
			}
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			return Desc{}, err
		}
	}
	b, err := m.encode()
	if err != nil {
		return Desc{}, err
	}
	d.Digest, d.Size = digestOf(b), m.Total()
	if err := s.blobs.Put(ctx, ManifestKey(d.Digest), bytes.NewReader(b), int64(len(b))); err != nil {
		return Desc{}, fmt.Errorf("store manifest: %w", err)
	}
	return d, nil
}

// putPart splits the file at path into content-defined chunks and stores
// the ones the store lacks, compressed.
func (s *Store) putPart(ctx context.Context, path string, d *Desc) (*Part, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, s.Parallel))
	var (
		p       Part
		mu      sync.Mutex
		seen    = map[string]bool{}
		newN    atomic.Int64
		newSize atomic.Int64
	)
	ch := newChunker(f)
	for {
		buf, err := ch.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			g.Wait()
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		sum := sha256.Sum256(buf)
		c := Chunk{Digest: contentdigest.Prefix + hex.EncodeToString(sum[:]), Size: int64(len(buf))}
		p.Chunks = append(p.Chunks, c)
		p.Size += c.Size
		mu.Lock()
		dup := seen[c.Digest]
		seen[c.Digest] = true
		mu.Unlock()
		if dup {
			continue
		}
		data := bytes.Clone(buf)
		g.Go(func() error {
			stored, err := s.putChunk(gctx, c, data)
			if stored > 0 {
				newN.Add(1)
				newSize.Add(stored)
			}
			return err
		})
		if gctx.Err() != nil {
			break
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	d.Chunks += len(p.Chunks)
	d.NewChunks += int(newN.Load())
	d.StoredBytes += newSize.Load()
	return &p, nil
}

// putChunk stores one chunk unless the store has it, and returns the
// compressed bytes it wrote.
func (s *Store) putChunk(ctx context.Context, c Chunk, data []byte) (int64, error) {
	key := ChunkKey(c.Digest)
	if _, err := s.blobs.Stat(ctx, key); err == nil {
		return 0, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return 0, fmt.Errorf("store chunk %s: %w", c.Digest, err)
	}
	z := s.enc.EncodeAll(data, make([]byte, 0, len(data)/2))
	if err := s.blobs.Put(ctx, key, bytes.NewReader(z), int64(len(z))); err != nil {
		return 0, fmt.Errorf("store chunk %s: %w", c.Digest, err)
	}
	return int64(len(z)), nil
}

// Manifest reads and verifies the manifest of the layer with the digest:
// errdefs.ErrNotFound if the store lacks it.
func (s *Store) Manifest(ctx context.Context, digest string) (*Manifest, []byte, error) {
	if _, err := contentdigest.Parse(digest); err != nil {
		return nil, nil, err
	}
	b, err := blob.ReadAll(ctx, s.blobs, ManifestKey(digest))
	if err != nil {
		return nil, nil, fmt.Errorf("layer %s: %w", digest, err)
	}
	m, err := ParseManifest(digest, b)
	return m, b, err
}

// ReadChunk fetches one chunk, decompresses it and checks it against its
// digest: a chunk whose bytes do not match is an error, never returned.
func (s *Store) ReadChunk(ctx context.Context, c Chunk) ([]byte, int64, error) {
	z, err := blob.ReadAll(ctx, s.blobs, ChunkKey(c.Digest))
	if err != nil {
		return nil, 0, fmt.Errorf("read chunk %s: %w", c.Digest, err)
	}
	data, err := s.dec.DecodeAll(z, make([]byte, 0, c.Size))
	if err != nil {
		return nil, 0, fmt.Errorf("read chunk %s: decompress: %w", c.Digest, err)
	}
	if int64(len(data)) != c.Size || digestOf(data) != c.Digest {
		return nil, 0, fmt.Errorf("read chunk %s: content does not match its digest", c.Digest)
	}
	return data, int64(len(z)), nil
}

// FetchPart writes a whole part to dst (created, or replaced atomically),
// fetching its chunks in parallel, and returns the compressed bytes read.
func (s *Store) FetchPart(ctx context.Context, p *Part, dst string) (int64, error) {
	f, err := os.CreateTemp(filepath.Dir(dst), ".fetch-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(p.Size); err != nil {
		return 0, err
	}
	var read atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, s.Parallel))
	offs := p.Offsets()
	for i, c := range p.Chunks {
		g.Go(func() error {
			data, n, err := s.ReadChunk(gctx, c)
			if err != nil {
				return err
			}
			read.Add(n)
			_, err = f.WriteAt(data, offs[i])
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return read.Load(), fmt.Errorf("fetch %s: %w", filepath.Base(dst), err)
	}
	if err := f.Chmod(0o444); err != nil {
		return read.Load(), err
	}
	if err := f.Close(); err != nil {
		return read.Load(), err
	}
	return read.Load(), os.Rename(f.Name(), dst)
}

// PrefetchKey is where a layer's hot-chunk list lives: a JSON array of
// indices into its blob's chunks, in the order to fetch them. It is a hint
// kept beside the manifest, not part of the layer's digest, so it can be
// recorded after the layer is built.
func PrefetchKey(digest string) string {
	return "prefetch/sha256/" + digest[len(contentdigest.Prefix):]
}

// PutPrefetch records a layer's hot-chunk list.
func (s *Store) PutPrefetch(ctx context.Context, digest string, chunks []int) error {
	m, _, err := s.Manifest(ctx, digest)
	if err != nil {
		return err
	}
	n := 0
	if m.Blob != nil {
		n = len(m.Blob.Chunks)
	}
	for _, i := range chunks {
		if i < 0 || i >= n {
			return errdefs.Invalid("prefetch chunk %d of layer %s with %d chunks", i, digest, n)
		}
	}
	b, err := json.Marshal(chunks)
	if err != nil {
		return err
	}
	return s.blobs.Put(ctx, PrefetchKey(digest), bytes.NewReader(b), int64(len(b)))
}
