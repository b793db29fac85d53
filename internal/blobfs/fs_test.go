package blobfs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/dsec-project/dsec/internal/blob/local"
	"github.com/dsec-project/dsec/internal/blobfs"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/mount"
	"github.com/dsec-project/dsec/internal/testutil"
)

// countingSource counts the fetches of each chunk.
type countingSource struct {
	*layer.Store
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingSource) ReadChunk(ctx context.Context, ch layer.Chunk) ([]byte, int64, error) {
	c.mu.Lock()
	c.calls[ch.Digest]++
	c.mu.Unlock()
	return c.Store.ReadChunk(ctx, ch)
}

type fixture struct {
	store     *layer.Store
	src       *countingSource
	digest    string
	manifest  *layer.Manifest
	blob      []byte // the whole blob, fetched directly
	meta      string // the metadata image on disk
	tree      string // the layer's source directory
	fs        *blobfs.FS
	mnt       string
	storeDir  string // the local blob store
	manifests string
}

// newFixture builds a layer of a few files (one spanning many chunks) and
// mounts a blobfs serving it with the given cache cap.
func newFixture(t *testing.T, cacheMax int64) *fixture {
	t.Helper()
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"), testutil.File("/dev/fuse"), testutil.Filesystem("fuse"))
	ctx := context.Background()
	storeDir := t.TempDir()
	bs, err := local.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := layer.NewStore(bs, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	big := make([]byte, 2<<20)
	rand.Read(big)
	files := map[string][]byte{
		"big.bin":        big,
		"small.txt":      []byte("hello\n"),
		"dir/medium.bin": bytes.Repeat([]byte("0123456789abcdef"), 40000),
	}
	for name, data := range files {
		p := filepath.Join(tree, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.Build(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	m, raw, err := st.Manifest(ctx, d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	fx := &fixture{store: st, digest: d.Digest, manifest: m, tree: tree, meta: filepath.Join(work, "meta.erofs"), storeDir: storeDir}
	if _, err := st.FetchPart(ctx, &m.Meta, fx.meta); err != nil {
		t.Fatal(err)
	}
	blobPath := filepath.Join(work, "blob")
	if _, err := st.FetchPart(ctx, m.Blob, blobPath); err != nil {
		t.Fatal(err)
	}
	if fx.blob, err = os.ReadFile(blobPath); err != nil {
		t.Fatal(err)
	}
	manifests := filepath.Join(work, "manifests")
	fx.manifests = manifests
	os.MkdirAll(manifests, 0o700)
	hex := strings.TrimPrefix(d.Digest, "sha256:")
	if err := os.WriteFile(filepath.Join(manifests, hex+".json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	fx.src = &countingSource{Store: st, calls: map[string]int{}}
	fx.mnt = filepath.Join(work, "mnt")
	fx.fs, err = blobfs.Mount(blobfs.Config{
		Mountpoint: fx.mnt, ManifestDir: manifests, CacheDir: filepath.Join(work, "cache"),
		CacheMax: cacheMax, Source: fx.src,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fx.fs.Close(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return fx
}

func (fx *fixture) blobPath() string {
	return filepath.Join(fx.mnt, strings.TrimPrefix(fx.digest, "sha256:"))
}

func TestReads(t *testing.T) {
	fx := newFixture(t, 1<<30)
	f, err := os.Open(fx.blobPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	if st.Size() != int64(len(fx.blob)) {
		t.Fatalf("blobfs file is %d bytes, blob %d", st.Size(), len(fx.blob))
	}
	offs := fx.manifest.Blob.Offsets()
	edge := offs[len(offs)/2]
	size := int64(len(fx.blob))
	tests := []struct {
		name   string
		off, n int64
	}{
		{"first byte", 0, 1},
		{"across a chunk edge", edge - 100, 200},
		{"exactly one chunk", edge, fx.manifest.Blob.Chunks[len(offs)/2].Size},
		{"across many chunks", offs[1] - 1, 600 << 10},
		{"tail", size - 4096, 4096},
		{"past the end is short only at the end", size - 10, 100},
		{"at the end", size, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, tc.n)
			n, err := f.ReadAt(buf, tc.off)
			want := fx.blob[min(tc.off, size):min(tc.off+tc.n, size)]
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("ReadAt: %v", err)
			}
			if !bytes.Equal(buf[:n], want) {
				t.Fatalf("ReadAt(%d, %d) = %d bytes, not the blob's %d", tc.off, tc.n, n, len(want))
			}
		})
	}
	t.Run("writes refused", func(t *testing.T) {
		if _, err := os.OpenFile(fx.blobPath(), os.O_WRONLY, 0); !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EACCES) {
			t.Fatalf("open for writing = %v", err)
		}
	})
	t.Run("unknown layer", func(t *testing.T) {
		if _, err := os.Stat(filepath.Join(fx.mnt, strings.Repeat("0", 64))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat of an unknown layer = %v", err)
		}
	})
}

// TestConcurrentReaders: many readers of overlapping ranges get the right
// bytes, and each chunk is fetched once.
func TestConcurrentReaders(t *testing.T) {
	fx := newFixture(t, 1<<30)
	size := int64(len(fx.blob))
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(fx.blobPath())
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			r := mrand.New(mrand.NewPCG(uint64(g), 1))
			for range 40 {
				off := r.Int64N(size)
				n := min(r.Int64N(300<<10)+1, size-off)
				buf := make([]byte, n)
				if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
					errs <- err
					return
				}
				if !bytes.Equal(buf, fx.blob[off:off+n]) {
					errs <- fmt.Errorf("wrong bytes at %d+%d", off, n)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	fx.src.mu.Lock()
	defer fx.src.mu.Unlock()
	for d, n := range fx.src.calls {
		if n != 1 {
			t.Errorf("chunk %s fetched %d times, want once", d, n)
		}
	}
	if s := fx.fs.Stats(); s.CacheHits == 0 || s.FetchedChunks != int64(len(fx.src.calls)) {
		t.Errorf("stats %+v, %d distinct chunks fetched", s, len(fx.src.calls))
	}
}

// TestCorruptChunk: a chunk whose stored bytes do not match its digest is
// never served: the read fails with EIO.
func TestCorruptChunk(t *testing.T) {
	fx := newFixture(t, 1<<30)
	c := fx.manifest.Blob.Chunks[1]
	enc, _ := zstd.NewWriter(nil)
	bad := enc.EncodeAll(bytes.Repeat([]byte{'x'}, int(c.Size)), nil)
	if err := fx.store.Blobs().Put(context.Background(), layer.ChunkKey(c.Digest), bytes.NewReader(bad), int64(len(bad))); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(fx.blobPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8192)
	_, err = f.ReadAt(buf, fx.manifest.Blob.Offsets()[1]+100)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a corrupt chunk = %v, want EIO", err)
	}
	if s := fx.fs.Stats(); s.ReadErrors == 0 || s.FetchErrors == 0 {
		t.Errorf("stats %+v: want a read and a fetch error", s)
	}
	// The chunk before it still reads.
	if _, err := f.ReadAt(buf[:100], 0); err != nil {
		t.Fatalf("read of a good chunk: %v", err)
	}
}

// TestEviction: with a cap of a few chunks, reading the whole blob keeps
// the cache near its cap and still returns the right bytes.
func TestEviction(t *testing.T) {
	const cacheMax = 300 << 10
	fx := newFixture(t, cacheMax)
	for pass := range 2 {
		got, err := os.ReadFile(fx.blobPath())
		if err != nil || !bytes.Equal(got, fx.blob) {
			t.Fatalf("pass %d: read %d bytes, %v", pass, len(got), err)
		}
	}
	s := fx.fs.Stats()
	if s.Evictions == 0 {
		t.Errorf("no evictions reading %d bytes through a %d-byte cache: %+v", len(fx.blob), cacheMax, s)
	}
	if s.CacheBytes > cacheMax {
		t.Errorf("cache holds %d bytes, cap %d", s.CacheBytes, cacheMax)
	}
}

// TestEROFSOverBlobfs mounts the layer with its blob read through blobfs:
// the files are whole, and reading one small file fetches a fraction of
// the blob.
func TestEROFSOverBlobfs(t *testing.T) {
	fx := newFixture(t, 1<<30)
	testutil.Require(t, testutil.Filesystem("erofs"))
	mnt := t.TempDir()
	src := mount.Source{Image: fx.meta, Device: fx.blobPath(), DirectIO: true}
	if err := mount.EROFSFrom(src, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.Unmount(mnt) })
	got, err := os.ReadFile(filepath.Join(mnt, "small.txt"))
	if err != nil || string(got) != "hello\n" {
		t.Fatalf("small.txt = %q, %v", got, err)
	}
	if s := fx.fs.Stats(); s.FetchedBytes == 0 || s.ReadBytes > int64(len(fx.blob))/4 {
		t.Errorf("after one small file: %+v of a %d-byte blob", s, len(fx.blob))
	}
	for _, name := range []string{"big.bin", "dir/medium.bin"} {
		want, _ := os.ReadFile(filepath.Join(fx.tree, name))
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, %v; want %d", name, len(got), err, len(want))
		}
	}
	if hot, ok := fx.fs.Touched(strings.TrimPrefix(fx.digest, "sha256:")); !ok || len(hot) == 0 {
		t.Errorf("Touched = %v, %v", hot, ok)
	}
}
