package layer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// baseDirs are the directories of the minimal base, with their modes.
var baseDirs = []struct {
	path string
	mode uint32
}{
	{".", 0o755},
	{"bin", 0o755},
	{"sbin", 0o755},
	{"usr", 0o755},
	{"usr/bin", 0o755},
	{"usr/sbin", 0o755},
	{"etc", 0o755},
	{"dev", 0o755},
	{"proc", 0o555},
	{"sys", 0o555},
	{"root", 0o700},
	{"tmp", 0o1777},
}

var baseFiles = []struct {
	path, content string
}{
	{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
	{"etc/group", "root:x:0:\nnobody:x:65534:\n"},
	{"etc/hostname", "sandbox\n"},
}

// MinimalBase lays out in outDir (created if missing) the smallest root
// file system a sandbox can run: the static busybox at busyboxPath as
// /bin/busybox, a symlink to it for every applet it lists (/bin/sh among
// them), /etc/passwd and /etc/group with root and nobody, /etc/hostname,
// /tmp (1777), /root, /proc, /sys and /dev. Everything is owned by root
// and dated to the epoch, so building it twice gives one image. Run as
// root.
func MinimalBase(ctx context.Context, busyboxPath, outDir string) error {
	out, err := exec.CommandContext(ctx, busyboxPath, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("minimal base: list busybox applets: %w", err)
	}
	if err := layoutBase(busyboxPath, outDir, out); err != nil {
		return fmt.Errorf("minimal base: %w", err)
	}
	return nil
}

func layoutBase(busyboxPath, outDir string, applets []byte) error {
	for _, d := range baseDirs {
		p := filepath.Join(outDir, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		// Not os.Chmod: a FileMode's sticky bit is not 01000.
		if err := unix.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("chmod %s: %w", d.path, err)
		}
	}
	if err := copyExecutable(busyboxPath, filepath.Join(outDir, "bin/busybox")); err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(applets))
	for sc.Scan() {
		name := path.Clean(string(bytes.TrimSpace(sc.Bytes())))
		if name == "." || name == "bin/busybox" {
			continue
		}
		if !filepath.IsLocal(name) {
			return errdefs.Invalid("busybox applet path %q is not relative", name)
		}
		p := filepath.Join(outDir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if _, err := os.Lstat(filepath.Join(outDir, "bin/sh")); err != nil {
		return fmt.Errorf("busybox %s has no sh applet: %w", busyboxPath, err)
	}
	for _, f := range baseFiles {
		if err := os.WriteFile(filepath.Join(outDir, f.path), []byte(f.content), 0o644); err != nil {
			return err
		}
		if err := unix.Chmod(filepath.Join(outDir, f.path), 0o644); err != nil {
			return err
		}
	}
	return filepath.WalkDir(outDir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := unix.Lchown(p, 0, 0); err != nil {
			return fmt.Errorf("chown %s: %w", p, err)
		}
		epoch := []unix.Timespec{{}, {}}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, epoch, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("set times of %s: %w", p, err)
		}
		return nil
	})
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return unix.Chmod(dst, 0o755)
}
