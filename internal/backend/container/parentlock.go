package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// lockDir holds the cgroup parents' locks: on /run, a tmpfs that a
// reboot empties, as it empties the cgroups.
var lockDir = "/run/dsec"

// lockCgroupParent takes, for the life of the backend, the host-wide
// lock of its cgroup parent. Each backend removes, at start, the cgroups
// under its parent that none of its sandboxes holds (recovery) and keeps
// emptied memory cgroups there (spares): two on one host with the same
// parent would take each other's for leftovers. The lock is a flock, so
// a backend that dies releases it with its process. root is written into
// the file for the message the next taker gets. Only a lock held by
// another backend is errdefs.ErrFailedPrecondition; any other error says
// the lock could not be taken at all.
func lockCgroupParent(parent, root string) (*os.File, error) {
	if err := os.MkdirAll(lockDir, 0o700); err != nil {
		return nil, fmt.Errorf("cgroup parent lock: %w", err)
	}
	path := LockPath(parent)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("cgroup parent lock: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder, _ := os.ReadFile(path)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("cgroup parent %q is in use by another dsec on this host (%s): give each its own --cgroup-parent: %w",
					parent, strings.TrimSpace(string(holder)), errdefs.ErrFailedPrecondition)
			}
			return nil, fmt.Errorf("cgroup parent lock: %w", err)
		}
		// The holder before us may have removed the file between our
		// open and our lock (unlockCgroupParent): then the lock is on
		// a file nobody else will open, and we start over.
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &named) == nil && held.Ino == named.Ino && held.Dev == named.Dev {
			if err := f.Truncate(0); err == nil {
				fmt.Fprintf(f, "pid %d, data %s\n", os.Getpid(), root)
			}
			return f, nil
		}
		f.Close()
	}
}

// LockPath is the file a container backend locks its cgroup parent by
// (lockCgroupParent): removed by Close, left by a death.
func LockPath(parent string) string {
	return filepath.Join(lockDir, "cgroup-"+strings.ReplaceAll(strings.Trim(filepath.Clean("/"+parent), "/"), "/", "_")+".lock")
}

// unlockCgroupParent removes the lock file and releases the lock (a nil
// f: none was taken). The file goes first, while the lock is held, so
// that no one takes a lock on it that the next taker would not see.
func unlockCgroupParent(f *os.File) {
	if f == nil {
		return
	}
	os.Remove(f.Name())
	f.Close()
}
