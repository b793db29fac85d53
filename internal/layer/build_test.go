package layer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

func extract(t *testing.T, tarball []byte) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := layer.ExtractTar(context.Background(), bytes.NewReader(tarball), dir, layer.Limits{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func build(t *testing.T, src string) (layer.Image, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "layer.erofs")
	img, err := layer.Build(context.Background(), src, out)
	if err != nil {
		t.Fatal(err)
	}
	return img, out
}

func TestBuildReproducible(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"))
	tarball := faithfulTar(t).Bytes()
	a, b := extract(t, tarball), extract(t, tarball)
	want, out := build(t, a)

	t.Run("digest names the bytes", func(t *testing.T) {
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != want.Digest || int64(len(data)) != want.Size {
			t.Errorf("image %s size %d, file %s size %d", want.Digest, want.Size, got, len(data))
		}
		if !layer.IsEROFS(bytes.NewReader(data)) {
			t.Error("IsEROFS = false for a built image")
		}
	})
	t.Run("same tree twice", func(t *testing.T) {
		if got, _ := build(t, a); got != want {
			t.Errorf("second build %+v, first %+v", got, want)
		}
	})
	t.Run("same tar extracted elsewhere", func(t *testing.T) {
		if got, _ := build(t, b); got != want {
			t.Errorf("build of second extraction %+v, first %+v", got, want)
		}
	})
	t.Run("SOURCE_DATE_EPOCH is ignored", func(t *testing.T) {
		t.Setenv("SOURCE_DATE_EPOCH", "12345")
		if got, _ := build(t, a); got != want {
			t.Errorf("build with SOURCE_DATE_EPOCH %+v, without %+v", got, want)
		}
	})
	t.Run("an mtime is part of the image", func(t *testing.T) {
		c := extract(t, tarball)
		ts := []unix.Timespec{{Sec: 42}, {Sec: 42}}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(c, "r"), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
		if got, _ := build(t, c); got.Digest == want.Digest {
			t.Error("changing an mtime kept the digest")
		}
	})
}

// TestBuildKeepsOverlayMetadata builds a lower and an upper layer, mounts
// them, and checks overlayfs sees the upper's whiteout and opaque dir.
func TestBuildKeepsOverlayMetadata(t *testing.T) {
	requireMounts(t)
	keep := file("keep", "k")
	keep.mtime = t1
	lowerDir := extract(t, tarOf(t, keep, file("gone", "g"), dir("od/"), file("od/x", "x")).Bytes())
	upperDir := extract(t, tarOf(t, file(".wh.gone", ""), dir("od/"), file("od/.wh..wh..opq", ""), file("od/new", "n")).Bytes())
	_, lowerImg := build(t, lowerDir)
	_, upperImg := build(t, upperDir)
	lower, upper := mountEROFS(t, lowerImg), mountEROFS(t, upperImg)
	ov := mountOverlay(t, upper, lower)

	tests := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"whiteout survives mkfs", func(t *testing.T) {
			if st := lstat(t, filepath.Join(upper, "gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
				t.Errorf("gone: mode %o rdev %x, want a 0/0 char device", st.Mode, st.Rdev)
			}
		}},
		{"opaque xattr survives mkfs", func(t *testing.T) {
			if v, _ := getxattr(filepath.Join(upper, "od"), "trusted.overlay.opaque"); v != "y" {
				t.Errorf("od: trusted.overlay.opaque = %q", v)
			}
		}},
		{"mtime survives mkfs", func(t *testing.T) {
			if st := lstat(t, filepath.Join(lower, "keep")); st.Mtim.Sec != t1.Unix() || st.Mtim.Nsec != int64(t1.Nanosecond()) {
				t.Errorf("keep: mtime %v, want %v", time.Unix(st.Mtim.Unix()), t1)
			}
		}},
		{"whited-out file hidden", func(t *testing.T) {
			if exists(filepath.Join(ov, "gone")) {
				t.Error("gone is visible through the overlay")
			}
		}},
		{"other lower file visible", func(t *testing.T) {
			if b, err := os.ReadFile(filepath.Join(ov, "keep")); err != nil || string(b) != "k" {
				t.Errorf("keep = %q, %v", b, err)
			}
		}},
		{"opaque dir hides lower contents", func(t *testing.T) {
			entries, err := os.ReadDir(filepath.Join(ov, "od"))
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 || entries[0].Name() != "new" {
				t.Errorf("od holds %v, want only new", entries)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.check)
	}
}

func TestBuildErrors(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"))
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), bytes.Repeat([]byte("x"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name   string
		ctx    context.Context
		src    string
		tinyFS bool // build onto a file system too small for the image
		want   string
	}{
		{"missing source", context.Background(), filepath.Join(src, "nope"), false, "no such file"},
		{"source is a file", context.Background(), filepath.Join(src, "f"), false, "not a directory"},
		// mkfs.erofs's own complaint reaches the error.
		{"mkfs fails", context.Background(), src, true, "No space left on device"},
		{"cancelled", cancelled, src, false, context.Canceled.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outDir := t.TempDir()
			if tt.tinyFS {
				if err := unix.Mount("tmpfs", outDir, "tmpfs", 0, "size=64k"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unix.Unmount(outDir, 0) })
			}
			_, err := layer.Build(tt.ctx, tt.src, filepath.Join(outDir, "out.erofs"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to say %q", err, tt.want)
			}
			if tt.name == "cancelled" && !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			if left, _ := os.ReadDir(outDir); len(left) != 0 {
				t.Errorf("left behind in the output directory: %v", left)
			}
		})
	}
}

func TestIsEROFS(t *testing.T) {
	sb := make([]byte, 2048)
	copy(sb[1024:], []byte{0xe2, 0xe1, 0xf5, 0xe0})
	tests := []struct {
		name string
		data []byte
		want bool
	}{
		{"magic at 1024", sb, true},
		{"zeros", make([]byte, 4096), false},
		{"too short", sb[:1026], false},
		{"empty", nil, false},
		{"magic at 0", append([]byte{0xe2, 0xe1, 0xf5, 0xe0}, make([]byte, 2044)...), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := layer.IsEROFS(bytes.NewReader(tt.data)); got != tt.want {
				t.Errorf("IsEROFS = %v, want %v", got, tt.want)
			}
		})
	}
}
