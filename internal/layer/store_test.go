package layer_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

func TestParseDigest(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	tests := []struct {
		in      string
		wantHex string
	}{
		{"sha256:" + hex64, hex64},
		{hex64, ""},
		{"sha256:" + strings.ToUpper(hex64), ""},
		{"sha256:" + hex64[:63], ""},
		{"sha256:" + hex64 + "0", ""},
		{"sha512:" + hex64, ""},
		{"sha256:" + hex64[:63] + "g", ""},
		{"sha256:../../../../etc/passwd", ""},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := layer.ParseDigest(tt.in)
			if tt.wantHex == "" {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Errorf("ParseDigest = %q, %v; want ErrInvalid", got, err)
				}
				return
			}
			if err != nil || got != tt.wantHex {
				t.Errorf("ParseDigest = %q, %v; want %q", got, err, tt.wantHex)
			}
		})
	}
}

// testImage builds a small image and returns its description and path.
func testImage(t *testing.T, content string) (layer.Image, string) {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return build(t, src)
}

func newStore(t *testing.T) (*layer.LocalStore, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := layer.NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever a test does, no temporary file may stay behind.
	t.Cleanup(func() {
		if left, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(left) != 0 {
			t.Errorf("temporary files left in the store: %v", left)
		}
	})
	return s, dir
}

func TestLocalStore(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	img, imgPath := testImage(t, "one")
	s, dir := newStore(t)
	missing := "sha256:" + strings.Repeat("0", 64)

	t.Run("put", func(t *testing.T) {
		got, err := s.Put(ctx, imgPath)
		if err != nil || got != img {
			t.Fatalf("Put = %+v, %v; want %+v", got, err, img)
		}
		p, err := s.Path(img.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dir, "sha256", strings.TrimPrefix(img.Digest, "sha256:")+".erofs"); p != want {
			t.Errorf("Path = %s, want %s", p, want)
		}
		a, _ := os.ReadFile(p)
		b, _ := os.ReadFile(imgPath)
		if !bytes.Equal(a, b) {
			t.Error("stored image differs from the source")
		}
		if st, _ := os.Stat(p); st.Mode().Perm() != 0o444 {
			t.Errorf("stored image mode %v, want read-only", st.Mode())
		}
	})
	t.Run("put again is a no-op", func(t *testing.T) {
		if got, err := s.Put(ctx, imgPath); err != nil || got != img {
			t.Errorf("Put = %+v, %v", got, err)
		}
	})
	t.Run("concurrent puts", func(t *testing.T) {
		other, otherPath := testImage(t, "two")
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				if got, err := s.Put(ctx, otherPath); err != nil || got != other {
					errs <- errors.Join(err, errors.New("wrong image"))
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	t.Run("stat", func(t *testing.T) {
		if got, err := s.Stat(img.Digest); err != nil || got != img {
			t.Errorf("Stat = %+v, %v", got, err)
		}
	})
	t.Run("import", func(t *testing.T) {
		data, _ := os.ReadFile(imgPath)
		if got, err := s.Import(ctx, bytes.NewReader(data)); err != nil || got != img {
			t.Errorf("Import = %+v, %v; want %+v", got, err, img)
		}
	})

	errTests := []struct {
		name string
		op   func() error
		want error
	}{
		{"put of a non-EROFS file", func() error {
			p := filepath.Join(t.TempDir(), "junk")
			os.WriteFile(p, bytes.Repeat([]byte("junk"), 2048), 0o644)
			_, err := s.Put(ctx, p)
			return err
		}, errdefs.ErrInvalid},
		{"import of garbage", func() error {
			_, err := s.Import(ctx, strings.NewReader(strings.Repeat("junk", 2048)))
			return err
		}, errdefs.ErrInvalid},
		{"import of a short stream", func() error {
			_, err := s.Import(ctx, strings.NewReader("short"))
			return err
		}, errdefs.ErrInvalid},
		{"import too large", func() error {
			small := *s
			small.MaxImportSize = img.Size - 1
			data, _ := os.ReadFile(imgPath)
			_, err := small.Import(ctx, bytes.NewReader(data))
			return err
		}, errdefs.ErrTooLarge},
		{"import cancelled", func() error {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			data, _ := os.ReadFile(imgPath)
			_, err := s.Import(cctx, bytes.NewReader(data))
			return err
		}, context.Canceled},
		{"path of a missing image", func() error { _, err := s.Path(missing); return err }, errdefs.ErrNotFound},
		{"path of a bad digest", func() error { _, err := s.Path("sha256:../x"); return err }, errdefs.ErrInvalid},
		{"stat of a missing image", func() error { _, err := s.Stat(missing); return err }, errdefs.ErrNotFound},
		{"delete of a missing image", func() error { return s.Delete(missing) }, errdefs.ErrNotFound},
		{"delete of a bad digest", func() error { return s.Delete("nope") }, errdefs.ErrInvalid},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.op(); !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}

	t.Run("import exactly at the limit", func(t *testing.T) {
		exact := *s
		exact.MaxImportSize = img.Size
		data, _ := os.ReadFile(imgPath)
		if _, err := exact.Import(ctx, bytes.NewReader(data)); err != nil {
			t.Error(err)
		}
	})
	t.Run("delete", func(t *testing.T) {
		if err := s.Delete(img.Digest); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Path(img.Digest); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Path after Delete: %v, want ErrNotFound", err)
		}
	})
}

func TestFromTar(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	s := newChunkStore(t)
	tmpRoot := t.TempDir()
	tests := []struct {
		name    string
		tarball []byte
		want    error
	}{
		{"layer", faithfulTar(t).Bytes(), nil},
		{"hostile tar", tarOf(t, file("../x", "")).Bytes(), errdefs.ErrInvalid},
		{"too large", tarOf(t, file("big", strings.Repeat("x", 100))).Bytes(), errdefs.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := layer.FromTar(ctx, bytes.NewReader(tt.tarball), s, tmpRoot, layer.Limits{MaxBytes: 99})
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Errorf("err = %v, want %v", err, tt.want)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				// The same tar built by hand gives the stored digest.
				want, err := s.Build(ctx, extract(t, tt.tarball))
				if err != nil || d.Digest != want.Digest {
					t.Errorf("FromTar = %+v, Build = %+v, %v", d, want, err)
				}
				if _, _, err := s.Manifest(ctx, d.Digest); err != nil {
					t.Error(err)
				}
			}
			if left, _ := os.ReadDir(tmpRoot); len(left) != 0 {
				t.Errorf("left behind in tmpRoot: %v", left)
			}
		})
	}
}

func TestLocalStoreRemovesStaleTemporaries(t *testing.T) {
	dir := t.TempDir()
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	stale, fresh := filepath.Join(tmp, "ingest-1.erofs"), filepath.Join(tmp, "ingest-2.erofs")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := layer.NewLocalStore(dir); err != nil {
		t.Fatal(err)
	}
	if exists(stale) {
		t.Error("a day-old temporary file survived")
	}
	if !exists(fresh) {
		t.Error("a fresh temporary file (an upload in progress) was removed")
	}
}
