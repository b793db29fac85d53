package layer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

const opaqueXattr = "trusted.overlay.opaque"

// Squash merges overlay layer directories (top first) into out, an empty
// directory, so that out stacked on whatever lay below the bottom one
// shows what the whole stack showed: the upper entry of a name wins;
// whiteouts that hide nothing inside the stack are kept (they hide the
// layers below); a directory whose merge stopped at an opaque directory, a
// whiteout or a non-directory is marked opaque. Owners, modes, times and
// xattrs are kept (trusted.overlay.* but opaque dropped); hard links
// between files become copies. Run as root.
func Squash(ctx context.Context, dirs []string, out string) error {
	if len(dirs) == 0 {
		return errdefs.Invalid("squash needs at least one directory")
	}
	if err := squashDir(ctx, dirs, out, "."); err != nil {
		return fmt.Errorf("squash layers: %w", err)
	}
	return nil
}

// squashDir merges rel in the given layers (where it is a directory in
// each, top first) into out/rel, which exists.
func squashDir(ctx context.Context, layers []string, out, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, l := range layers {
		ents, err := os.ReadDir(filepath.Join(l, rel))
		if err != nil {
			return err
		}
		for _, e := range ents {
			name := e.Name()
			if seen[name] {
				continue
			}
			seen[name] = true
			src := filepath.Join(l, rel, name)
			dst := filepath.Join(out, rel, name)
			var st unix.Stat_t
			if err := unix.Lstat(src, &st); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				if err := copyEntry(src, dst, &st); err != nil {
					return err
				}
				continue
			}
			chain, opaque := dirChain(layers[i:], filepath.Join(rel, name))
			if err := os.Mkdir(dst, 0o700); err != nil {
				return err
			}
			if err := squashDir(ctx, chain, out, filepath.Join(rel, name)); err != nil {
				return err
			}
			if err := copyAttrs(src, dst, &st, opaque); err != nil {
				return err
			}
		}
	}
	if rel == "." {
		var st unix.Stat_t
		if err := unix.Lstat(layers[0], &st); err != nil {
			return err
		}
		_, opaque := dirChain(layers, ".")
		return copyAttrs(layers[0], out, &st, opaque)
	}
	return nil
}

// dirChain returns the layers (top first, starting with layers[0] where
// rel is a directory) whose rel directories merge, and whether the merge
// stopped short of the bottom layer: an opaque directory, a whiteout or a
// non-directory ends it, and must go on hiding what lies below the stack.
func dirChain(layers []string, rel string) ([]string, bool) {
	chain := []string{layers[0]}
	if isOpaque(filepath.Join(layers[0], rel)) {
		return chain, true
	}
	for _, l := range layers[1:] {
		var st unix.Stat_t
		err := unix.Lstat(filepath.Join(l, rel), &st)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return chain, true // a whiteout or a file: lower ones are hidden
		}
		chain = append(chain, l)
		if isOpaque(filepath.Join(l, rel)) {
			return chain, true
		}
	}
	return chain, false
}

func isOpaque(dir string) bool {
	v := make([]byte, 4)
	n, err := unix.Lgetxattr(dir, opaqueXattr, v)
	return err == nil && n == 1 && v[0] == 'y'
}

// copyEntry copies a non-directory (file, symlink, device, whiteout,
// fifo, socket) with its attributes.
func copyEntry(src, dst string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		o, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(o, in)
		if cerr := o.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	default:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", dst, err)
		}
	}
	return copyAttrs(src, dst, st, false)
}

// copyAttrs gives dst src's owner, mode, xattrs and times; opaque marks a
// directory opaque.
func copyAttrs(src, dst string, st *unix.Stat_t, opaque bool) error {
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if strings.HasPrefix(name, "trusted.overlay.") {
			continue
		}
		v, err := getXattr(src, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, v, 0); err != nil {
			return fmt.Errorf("set %s on %s: %w", name, dst, err)
		}
	}
	if opaque {
		if err := unix.Lsetxattr(dst, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %s opaque: %w", dst, err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func listXattrs(p string) ([]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			names = append(names, n)
		}
	}
	return names, nil
}

func getXattr(p, name string) ([]byte, error) {
	sz, err := unix.Lgetxattr(p, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:sz], nil
}
