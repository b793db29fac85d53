package layer

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// The file-system primitives ExtractTar is built from. Every one works on a
// directory fd from openBeneath and a single path component: openat2
// resolves the parent under RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS (nothing
// above the root, no symlink anywhere on the way, checked by the kernel
// during the lookup itself, so there is no check-then-use race), and the
// final component is acted on with *at calls that do not follow it.
// openat2 needs Linux 5.6.

// beneath is how every parent directory is opened: never above the root,
// never through a symlink (planted by an earlier entry or not), never
// through a magic link, never onto another mount.
var beneath = unix.OpenHow{
	Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
}

// openBeneath opens the directory rel (a clean relative path, "." for the
// root) beneath root. With mkdir set it creates missing components (see
// mkdirParent), calling created with each one's path.
func openBeneath(root int, rel string, mkdir bool, created func(string)) (int, error) {
	how := beneath
	fd, err := unix.Openat2(root, rel, &how)
	if err == nil {
		return fd, nil
	}
	if !mkdir || !(errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)) {
		return -1, resolveError(rel, err)
	}
	fd, err = unix.Openat2(root, ".", &how)
	if err != nil {
		return -1, fmt.Errorf("open extraction root: %w", err)
	}
	done := ""
	for _, comp := range strings.Split(rel, "/") {
		done = joinRel(done, comp)
		next, err := unix.Openat2(fd, comp, &how)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			if err := mkdirParent(fd, comp, err); err != nil {
				unix.Close(fd)
				return -1, resolveError(done, err)
			}
			created(done)
			next, err = unix.Openat2(fd, comp, &how)
		}
		unix.Close(fd)
		if err != nil {
			return -1, resolveError(done, err)
		}
		fd = next
	}
	return fd, nil
}

// mkdirParent creates a parent directory the tar left implicit, after
// openat2 failed on it with openErr. A whiteout in the way (this tar
// deleted the lower directory, then puts files in a new one) becomes an
// opaque directory; anything else in the way stays and fails the entry.
// The mode is set explicitly so the tree does not depend on the umask.
func mkdirParent(dirfd int, name string, openErr error) error {
	st, err := lstatAt(dirfd, name)
	if err != nil {
		return err
	}
	if st.exists && !st.whiteout {
		return openErr
	}
	if st.whiteout {
		if err := unix.Unlinkat(dirfd, name, 0); err != nil {
			return fmt.Errorf("remove whiteout: %w", err)
		}
	}
	if err := unix.Mkdirat(dirfd, name, 0o755); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	if err := unix.Fchownat(dirfd, name, 0, 0, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown directory: %w", err)
	}
	if err := unix.Fchmodat(dirfd, name, 0o755, 0); err != nil {
		return fmt.Errorf("chmod directory: %w", err)
	}
	if st.whiteout {
		return lsetxattrAt(dirfd, name, overlayOpaque, []byte("y"))
	}
	return nil
}

// resolveError explains why a path could not be opened beneath the root.
// The refusals are the tar's fault, so they are ErrInvalid.
func resolveError(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return errdefs.Invalid("%s: path goes through a symlink", rel)
	case errors.Is(err, unix.ENOTDIR):
		return errdefs.Invalid("%s: a path component is not a directory", rel)
	case errors.Is(err, unix.EXDEV):
		return errdefs.Invalid("%s: path leaves the extraction directory", rel)
	case errors.Is(err, unix.ENOENT):
		return errdefs.Invalid("%s: no such directory", rel)
	}
	return fmt.Errorf("open %s: %w", rel, err)
}

func joinRel(dir, name string) string {
	if dir == "" || dir == "." {
		return name
	}
	return dir + "/" + name
}

// removeAt removes name from dirfd, recursively if it is a directory. It
// never follows a symlink: a symlink is removed, not what it points at.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s for removal: %w", name, err)
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	for {
		names, err := d.Readdirnames(1024)
		for _, n := range names {
			if err := removeAt(fd, n); err != nil {
				return err
			}
		}
		if err != nil || len(names) == 0 {
			break
		}
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove directory %s: %w", name, err)
	}
	return nil
}

// entryState is what lstatAt found.
type entryState struct {
	exists   bool
	dir      bool // a directory (a symlink to one is not)
	whiteout bool // an overlayfs whiteout, a 0/0 character device
}

// lstatAt looks at name in dirfd without following it.
func lstatAt(dirfd int, name string) (entryState, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return entryState{}, nil
	}
	if err != nil {
		return entryState{}, fmt.Errorf("stat %s: %w", name, err)
	}
	typ := st.Mode & unix.S_IFMT
	return entryState{
		exists:   true,
		dir:      typ == unix.S_IFDIR,
		whiteout: typ == unix.S_IFCHR && st.Rdev == 0,
	}, nil
}

// lsetxattrAt sets an xattr on name in dirfd without following name if it
// is a symlink. The /proc/self/fd path jumps straight to the directory the
// fd holds, so only the last component is looked up, and lsetxattr does not
// follow that.
func lsetxattrAt(dirfd int, name, attr string, value []byte) error {
	p := fmt.Sprintf("/proc/self/fd/%d/%s", dirfd, name)
	if err := unix.Lsetxattr(p, attr, value, 0); err != nil {
		return fmt.Errorf("set xattr %s on %s: %w", attr, name, err)
	}
	return nil
}

// setTimesAt sets the access and modification times of name in dirfd
// without following a symlink.
func setTimesAt(dirfd int, name string, ts unix.Timespec) error {
	if err := unix.UtimesNanoAt(dirfd, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %q: %w", name, err)
	}
	return nil
}
