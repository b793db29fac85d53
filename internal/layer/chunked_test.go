package layer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/blob/local"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/mount"
)

func newChunkStore(t *testing.T) *layer.Store {
	t.Helper()
	bs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := layer.NewStore(bs, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fetchAndMount fetches a layer's files whole and mounts them until the
// test ends.
func fetchAndMount(t *testing.T, s *layer.Store, digest string) string {
	t.Helper()
	ctx := context.Background()
	m, _, err := s.Manifest(ctx, digest)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := mount.Source{Image: filepath.Join(dir, "meta")}
	if _, err := s.FetchPart(ctx, &m.Meta, src.Image); err != nil {
		t.Fatal(err)
	}
	if m.Blob != nil {
		src.Device = filepath.Join(dir, "blob")
		if _, err := s.FetchPart(ctx, m.Blob, src.Device); err != nil {
			t.Fatal(err)
		}
	}
	mnt := t.TempDir()
	if err := mount.EROFSFrom(src, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.Unmount(mnt) })
	return mnt
}

func TestChunkedLayer(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	s := newChunkStore(t)
	src := extract(t, faithfulTar(t).Bytes())
	big := make([]byte, 3<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(src, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := s.Build(ctx, src)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("round trip keeps every file and attribute", func(t *testing.T) {
		mnt := fetchAndMount(t, s, d.Digest)
		if got, want := tree(t, mnt), tree(t, src); got != want {
			t.Errorf("mounted layer differs from its source:\n got %s\nwant %s", got, want)
		}
		got, err := os.ReadFile(filepath.Join(mnt, "big.bin"))
		if err != nil || !bytes.Equal(got, big) {
			t.Errorf("big.bin: %d bytes, %v", len(got), err)
		}
	})
	t.Run("data lives in the blob, not the metadata", func(t *testing.T) {
		m, _, err := s.Manifest(ctx, d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if m.Blob == nil || m.Blob.Size < int64(len(big)) || m.Meta.Size > 256<<10 {
			t.Errorf("meta %d bytes, blob %+v", m.Meta.Size, m.Blob)
		}
	})
	t.Run("same tree, same digest, nothing new stored", func(t *testing.T) {
		again, err := s.Build(ctx, src)
		if err != nil {
			t.Fatal(err)
		}
		if again.Digest != d.Digest || again.NewChunks != 0 {
			t.Errorf("rebuild = %+v, want digest %s and no new chunks", again, d.Digest)
		}
	})
	t.Run("identical data in another layer is stored once", func(t *testing.T) {
		other := t.TempDir()
		if err := os.WriteFile(filepath.Join(other, "prefix"), []byte("a different layer"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(other, "copy.bin"), big, 0o644); err != nil {
			t.Fatal(err)
		}
		o, err := s.Build(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		// The 3 MiB of random data compress to nothing: only chunks at
		// its edges and the metadata may be new.
		if o.StoredBytes > 1<<20 {
			t.Errorf("second layer stored %d new bytes for %d of known data", o.StoredBytes, len(big))
		}
	})
	t.Run("corrupt chunk is refused", func(t *testing.T) {
		m, _, _ := s.Manifest(ctx, d.Digest)
		c := m.Blob.Chunks[0]
		bad := append([]byte(nil), []byte("not the chunk")...)
		if err := s.Blobs().Put(ctx, layer.ChunkKey(c.Digest), bytes.NewReader(bad), int64(len(bad))); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.ReadChunk(ctx, c); err == nil {
			t.Error("ReadChunk of a corrupted chunk succeeded")
		}
	})
}

func TestChunkedLayerEmptyTree(t *testing.T) {
	requireMounts(t)
	s := newChunkStore(t)
	d, err := s.Build(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mnt := fetchAndMount(t, s, d.Digest)
	if ents, err := os.ReadDir(mnt); err != nil || len(ents) != 0 {
		t.Errorf("empty layer lists %v, %v", ents, err)
	}
}

func TestImportImage(t *testing.T) {
	requireMounts(t)
	s := newChunkStore(t)
	src := extract(t, faithfulTar(t).Bytes())
	_, img := build(t, src)
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := s.ImportImage(context.Background(), f, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	mnt := fetchAndMount(t, s, d.Digest)
	if got, want := tree(t, mnt), tree(t, src); got != want {
		t.Errorf("imported layer differs:\n got %s\nwant %s", got, want)
	}
	if _, err := s.ImportImage(context.Background(), bytes.NewReader(make([]byte, 8192)), 1<<30); err == nil {
		t.Error("ImportImage of zeros succeeded")
	}
}

// tree is snapshot with paths relative to dir, to compare two trees.
func tree(t *testing.T, dir string) string {
	return strings.ReplaceAll(snapshot(t, dir), dir, "")
}

// TestRemove removes one of two layers that share data: the shared chunks
// stay and the other layer still reads whole; the removed layer's own
// chunks and manifest go.
func TestRemove(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	s := newChunkStore(t)
	shared := make([]byte, 2<<20)
	rand.Read(shared)
	build := func(own string) layer.Desc {
		dir := t.TempDir()
		own64 := make([]byte, 1<<20)
		rand.Read(own64)
		for name, data := range map[string][]byte{"shared.bin": shared, "own.bin": own64, "name": []byte(own)} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		d, err := s.Build(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	keep, gone := build("keep"), build("gone")
	chunksOf := func(digest string) []string {
		m, _, err := s.Manifest(ctx, digest)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range append(m.Meta.Chunks, m.Blob.Chunks...) {
			out = append(out, c.Digest)
		}
		return out
	}
	keepChunks, goneChunks := chunksOf(keep.Digest), chunksOf(gone.Digest)

	st, err := s.Remove(ctx, []string{gone.Digest, "sha256:" + strings.Repeat("0", 64)})
	if err != nil {
		t.Fatal(err)
	}
	if st.Layers != 1 || st.Chunks == 0 || st.Bytes == 0 || st.Scanned != 1 {
		t.Fatalf("remove stats %+v", st)
	}
	if _, _, err := s.Manifest(ctx, gone.Digest); err == nil {
		t.Fatal("the removed layer's manifest is still there")
	}
	present := map[string]bool{}
	for _, c := range append(keepChunks, goneChunks...) {
		_, err := s.Blobs().Stat(ctx, layer.ChunkKey(c))
		present[c] = err == nil
	}
	for _, c := range keepChunks {
		if !present[c] {
			t.Fatalf("chunk %s of the kept layer was removed", c)
		}
	}
	removed := 0
	for _, c := range goneChunks {
		if !present[c] {
			removed++
		}
	}
	if removed != st.Chunks {
		t.Fatalf("%d chunks of the removed layer are gone, stats say %d", removed, st.Chunks)
	}
	mnt := fetchAndMount(t, s, keep.Digest)
	if got, err := os.ReadFile(filepath.Join(mnt, "shared.bin")); err != nil || !bytes.Equal(got, shared) {
		t.Fatalf("kept layer's shared data after the remove: %d bytes, %v", len(got), err)
	}
	if st, err := s.Remove(ctx, []string{gone.Digest}); err != nil || st.Layers != 0 {
		t.Fatalf("removing it again: %+v %v", st, err)
	}
}
