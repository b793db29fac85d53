package layer_test

import (
	"context"
	"debug/elf"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/layer"
	"github.com/dsec-project/dsec/internal/testutil"
)

// staticBusybox requires a busybox on PATH that needs no shared libraries.
func staticBusybox(path *string) testutil.Requirement {
	return func() string {
		p, err := exec.LookPath("busybox")
		if err != nil {
			return "needs busybox on PATH"
		}
		f, err := elf.Open(p)
		if err != nil {
			return "cannot read " + p + ": " + err.Error()
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				return p + " is not static (install busybox-static)"
			}
		}
		*path = p
		return ""
	}
}

func TestMinimalBase(t *testing.T) {
	var busybox string
	requireMounts(t)
	testutil.Require(t, staticBusybox(&busybox))
	ctx := context.Background()
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := layer.MinimalBase(ctx, busybox, rootfs); err != nil {
		t.Fatal(err)
	}
	p := func(rel string) string { return filepath.Join(rootfs, rel) }

	t.Run("layout", func(t *testing.T) {
		tests := []struct {
			rel  string
			mode uint32
		}{
			{"bin/busybox", unix.S_IFREG | 0o755},
			{"tmp", unix.S_IFDIR | 0o1777},
			{"root", unix.S_IFDIR | 0o700},
			{"proc", unix.S_IFDIR | 0o555},
			{"sys", unix.S_IFDIR | 0o555},
			{"dev", unix.S_IFDIR | 0o755},
			{"usr/bin", unix.S_IFDIR | 0o755},
			{"usr/sbin", unix.S_IFDIR | 0o755},
			{"sbin", unix.S_IFDIR | 0o755},
			{"etc/hostname", unix.S_IFREG | 0o644},
		}
		for _, tt := range tests {
			if st := lstat(t, p(tt.rel)); st.Mode != tt.mode {
				t.Errorf("%s: mode %o, want %o", tt.rel, st.Mode, tt.mode)
			}
		}
		if target, err := os.Readlink(p("bin/sh")); err != nil || target != "/bin/busybox" {
			t.Errorf("bin/sh -> %q, %v", target, err)
		}
		for _, f := range []string{"etc/passwd", "etc/group"} {
			if b, _ := os.ReadFile(p(f)); !strings.HasPrefix(string(b), "root:x:0:") {
				t.Errorf("%s = %q", f, b)
			}
		}
	})
	t.Run("every applet linked", func(t *testing.T) {
		out, err := exec.Command(busybox, "--list-full").Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, applet := range strings.Fields(string(out)) {
			if applet != "bin/busybox" && !exists(p(applet)) {
				t.Errorf("%s missing", applet)
			}
		}
	})
	t.Run("root-owned at the epoch", func(t *testing.T) {
		filepath.WalkDir(rootfs, func(path string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if st := lstat(t, path); st.Uid != 0 || st.Gid != 0 || st.Mtim.Sec != 0 {
				t.Errorf("%s: owner %d:%d mtime %d", path, st.Uid, st.Gid, st.Mtim.Sec)
			}
			return nil
		})
	})
	t.Run("reproducible", func(t *testing.T) {
		again := filepath.Join(t.TempDir(), "rootfs")
		if err := layer.MinimalBase(ctx, busybox, again); err != nil {
			t.Fatal(err)
		}
		if a, b := mustBuild(t, rootfs), mustBuild(t, again); a != b {
			t.Errorf("two minimal bases give %s and %s", a.Digest, b.Digest)
		}
	})
	t.Run("sh runs from the mounted layer", func(t *testing.T) {
		_, img := build(t, rootfs)
		// An overlay, as a sandbox gets it: the layer mount itself is noexec.
		ov := mountOverlay(t, mountEROFS(t, img))
		cmd := exec.Command("/bin/sh", "-c", "echo hello from $(id -u) in $(cat /etc/hostname)")
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: ov}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"}
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != "hello from 0 in sandbox\n" {
			t.Errorf("sh: %q, %v", out, err)
		}
	})
}

func mustBuild(t *testing.T, src string) layer.Image {
	t.Helper()
	img, _ := build(t, src)
	return img
}
