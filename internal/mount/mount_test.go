package mount

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

func requireMounts(t *testing.T) {
	t.Helper()
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.erofs"),
		testutil.Filesystem("erofs"), testutil.Filesystem("overlay"))
}

// testTree is a directory for an image: regular files by path, plus
// device nodes.
type testTree struct {
	files   map[string]string
	devices map[string]uint64 // path -> char device number
}

// buildImage builds an EROFS image of tree and returns its digest and path.
func buildImage(t *testing.T, tree testTree) (string, string) {
	t.Helper()
	src := t.TempDir()
	for p, content := range tree.files {
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, dev := range tree.devices {
		if err := unix.Mknod(filepath.Join(src, p), unix.S_IFCHR|0o666, int(dev)); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "image.erofs")
	img, err := layer.Build(context.Background(), src, out)
	if err != nil {
		t.Fatal(err)
	}
	return img.Digest, out
}

// unmountAtCleanup unmounts target when the test ends; registered after
// the directories it lives in, it runs before they are removed.
func unmountAtCleanup(t *testing.T, target string) {
	t.Cleanup(func() {
		if err := Unmount(target); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func findMount(t *testing.T, target string) (Info, bool) {
	t.Helper()
	infos, err := Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	var found []Info
	for _, m := range infos {
		if m.Mountpoint == target {
			found = append(found, m)
		}
	}
	if len(found) > 1 {
		t.Fatalf("%d mounts at %s", len(found), target)
	}
	if len(found) == 0 {
		return Info{}, false
	}
	return found[0], true
}

func isMountpoint(t *testing.T, p string) bool {
	t.Helper()
	ok, err := IsMountpoint(p)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestEROFSRoundTrip(t *testing.T) {
	requireMounts(t)
	_, img := buildImage(t, testTree{files: map[string]string{"dir/hello": "world"}})
	// A space exercises mountinfo's octal escapes.
	target := filepath.Join(t.TempDir(), "layer mount")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := EROFS(img, target); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, target)

	t.Run("contents", func(t *testing.T) {
		if b, err := os.ReadFile(filepath.Join(target, "dir/hello")); err != nil || string(b) != "world" {
			t.Errorf("dir/hello = %q, %v", b, err)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		err := os.WriteFile(filepath.Join(target, "new"), nil, 0o644)
		if !errors.Is(err, unix.EROFS) {
			t.Errorf("write: %v, want EROFS", err)
		}
	})
	t.Run("mountinfo", func(t *testing.T) {
		m, ok := findMount(t, target)
		if !ok {
			t.Fatalf("no mount at %q in mountinfo", target)
		}
		// File-backed: the source is the image itself, not a loop device.
		if m.FSType != "erofs" || m.Source != img {
			t.Errorf("mount %s from %s, want erofs from %s", m.FSType, m.Source, img)
		}
		for _, opt := range []string{"ro", "nodev", "nosuid", "noexec"} {
			if !strings.Contains(","+m.Options+",", ","+opt+",") {
				t.Errorf("options %q lack %s", m.Options, opt)
			}
		}
		under, err := MountsUnder(filepath.Dir(target))
		if err != nil || len(under) != 1 || under[0].Mountpoint != target {
			t.Errorf("MountsUnder = %v, %v", under, err)
		}
	})
	t.Run("is a mountpoint", func(t *testing.T) {
		if !isMountpoint(t, target) || isMountpoint(t, filepath.Join(target, "dir")) {
			t.Error("IsMountpoint wrong for the mount or a directory inside it")
		}
		// The fallback for kernels without STATX_ATTR_MOUNT_ROOT.
		in, err1 := inMountinfo(target)
		inside, err2 := inMountinfo(filepath.Join(target, "dir"))
		if !in || inside || err1 != nil || err2 != nil {
			t.Errorf("inMountinfo: mount %v (%v), directory inside it %v (%v)", in, err1, inside, err2)
		}
	})
	t.Run("unmount", func(t *testing.T) {
		if err := Unmount(target); err != nil {
			t.Fatal(err)
		}
		if isMountpoint(t, target) {
			t.Error("still mounted")
		}
		if err := Unmount(target); err != nil {
			t.Errorf("second unmount: %v", err)
		}
		if err := Unmount(filepath.Join(target, "missing")); err != nil {
			t.Errorf("unmount of a missing path: %v", err)
		}
	})
}

func TestEROFSRejectsNonImage(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Filesystem("erofs"))
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	if err := EROFS(junk, target); err == nil {
		unmountAtCleanup(t, target)
		t.Fatal("mounted a file of zeros")
	}
}

func TestOverlay(t *testing.T) {
	requireMounts(t)
	_, baseImg := buildImage(t, testTree{
		files:   map[string]string{"etc/os": "base", "gone": "g", "dir/a": "a"},
		devices: map[string]uint64{"null": unix.Mkdev(1, 3)},
	})
	_, topImg := buildImage(t, testTree{files: map[string]string{"etc/os": "top"}})
	tmp := t.TempDir()
	base, top := filepath.Join(tmp, "base"), filepath.Join(tmp, "top")
	upper, work, root := filepath.Join(tmp, "upper"), filepath.Join(tmp, "work"), filepath.Join(tmp, "root")
	for _, d := range []string{base, top, upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []struct{ img, dir string }{{baseImg, base}, {topImg, top}} {
		if err := EROFS(l.img, l.dir); err != nil {
			t.Fatal(err)
		}
		unmountAtCleanup(t, l.dir)
	}
	if err := Overlay([]string{top, base}, upper, work, root); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, root)

	tests := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"top layer wins", func(t *testing.T) {
			if b, _ := os.ReadFile(filepath.Join(root, "etc/os")); string(b) != "top" {
				t.Errorf("etc/os = %q, want top", b)
			}
		}},
		{"writes land in upper", func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(root, "etc/new"), []byte("n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(upper, "etc/new")); string(b) != "n" {
				t.Errorf("upper/etc/new = %q", b)
			}
		}},
		{"delete leaves a whiteout in upper", func(t *testing.T) {
			if err := os.Remove(filepath.Join(root, "gone")); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(upper, "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
				t.Errorf("upper/gone: %v mode %o rdev %x, want a whiteout", err, st.Mode, st.Rdev)
			}
			if _, err := os.Lstat(filepath.Join(root, "gone")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("gone still visible: %v", err)
			}
		}},
		{"renaming a lower dir copies (redirect_dir=off)", func(t *testing.T) {
			err := unix.Rename(filepath.Join(root, "dir"), filepath.Join(root, "moved"))
			if !errors.Is(err, unix.EXDEV) {
				t.Errorf("rename of a lower dir: %v, want EXDEV", err)
			}
		}},
		{"chmod copies data up (metacopy=off)", func(t *testing.T) {
			if err := os.Chmod(filepath.Join(root, "dir/a"), 0o600); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(upper, "dir/a")); string(b) != "a" {
				t.Errorf("upper/dir/a = %q, want the full data", b)
			}
		}},
		{"read-only overlay", func(t *testing.T) {
			ro := filepath.Join(tmp, "ro")
			if err := os.Mkdir(ro, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := Overlay([]string{top, base}, "", "", ro); err != nil {
				t.Fatal(err)
			}
			defer Unmount(ro)
			if b, _ := os.ReadFile(filepath.Join(ro, "etc/os")); string(b) != "top" {
				t.Errorf("etc/os = %q, want top", b)
			}
			if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
				t.Errorf("write: %v, want EROFS", err)
			}
		}},
		{"layer devices do not open (nodev)", func(t *testing.T) {
			f, err := os.OpenFile(filepath.Join(root, "null"), os.O_WRONLY, 0)
			if err == nil {
				f.Close()
			}
			if !errors.Is(err, unix.EACCES) {
				t.Errorf("open of a layer's device node: %v, want EACCES", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.check)
	}
}

func TestOverlayOptions(t *testing.T) {
	long := strings.Repeat("/very/long/layer/path", 30)
	tests := []struct {
		name              string
		lowers            []string
		upper, work       string
		wantOpts, wantErr string
	}{
		{"writable", []string{"/l/top", "/l/base"}, "/u", "/w",
			"lowerdir=/l/top:/l/base,upperdir=/u,workdir=/w,redirect_dir=off,metacopy=off", ""},
		{"read-only", []string{"/a", "/b"}, "", "",
			"lowerdir=/a:/b,redirect_dir=off,metacopy=off", ""},
		{"no lowers", nil, "/u", "/w", "", "at least one lower"},
		{"read-only single lower", []string{"/a"}, "", "", "", "at least two lower"},
		{"upper without work", []string{"/a"}, "/u", "", "", "both an upper and a work"},
		{"comma", []string{"/a,b"}, "/u", "/w", "", "contains"},
		{"colon", []string{"/a"}, "/u:x", "/w", "", "contains"},
		{"longer than a page", []string{long, long, long, long, long, long, long}, "/u", "/w", "", "page"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := overlayOptions(tt.lowers, tt.upper, tt.work)
			if tt.wantErr != "" {
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("err = %v, want ErrInvalid saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || opts != tt.wantOpts {
				t.Errorf("options = %q, %v; want %q", opts, err, tt.wantOpts)
			}
		})
	}
}

// TestUnmountBusy holds a file open on a mount: Unmount must still
// succeed, detaching it once retries run out.
func TestUnmountBusy(t *testing.T) {
	requireMounts(t)
	_, img := buildImage(t, testTree{files: map[string]string{"f": "x"}})
	target := t.TempDir()
	if err := EROFS(img, target); err != nil {
		t.Fatal(err)
	}
	unmountAtCleanup(t, target)
	f, err := os.Open(filepath.Join(target, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Unmount(target, 0); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("plain unmount with an open file: %v, want EBUSY", err)
	}
	if err := Unmount(target); err != nil {
		t.Fatal(err)
	}
	if isMountpoint(t, target) {
		t.Error("still mounted after Unmount")
	}
	if b := make([]byte, 1); func() error { _, err := f.Read(b); return err }() != nil {
		t.Error("the open file stopped working after a lazy unmount")
	}
}
