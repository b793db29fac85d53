package idmap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// secbitNoSetuidFixup keeps a thread's capabilities when its fsuid leaves
// 0 (linux/securebits.h).
const secbitNoSetuidFixup = 1 << 2

// Overlay mounts an overlayfs at target over lowers (top first), with the
// writable layer in upperRoot/upper and upperRoot/work, every one of them
// seen through an idmapped mount of r: a file stored as uid 0 appears as
// r.Base. userns must map r (see UserNS).
//
// The overlay is created with fsuid and fsgid r.Base, so the directories
// overlayfs makes for itself (and its copy-ups) map back to uid 0 on disk.
// The idmapped layers are detached mounts the overlay alone holds: nothing
// is attached but target. Needs Linux 6.13 or newer (overlay layers given
// as file descriptors).
func Overlay(r Range, userns *os.File, lowers []string, upperRoot, target string) error {
	mfd, release, err := DetachedOverlay(r, userns, lowers, upperRoot)
	if err != nil {
		return fmt.Errorf("idmapped overlay on %s: %w", target, err)
	}
	defer release()
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("idmapped overlay on %s: move_mount: %w", target, err)
	}
	return nil
}

// DetachedOverlay makes the overlay Overlay mounts, as a detached mount:
// mfd, attached nowhere, valid until release is called (which dissolves
// it if it is still detached then).
func DetachedOverlay(r Range, userns *os.File, lowers []string, upperRoot string) (mfd int, release func(), err error) {
	var fds []int
	// Closing a detached mount dissolves it, and that waits for an RCU
	// grace period (tens of ms on a busy node) per mount: not on the
	// create path.
	release = func() {
		go func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	keep := func(fd int) int { fds = append(fds, fd); return fd }
	var lowerFDs []int
	for _, l := range lowers {
		fd, err := idmapped(l, userns)
		if err != nil {
			return -1, nil, err
		}
		lowerFDs = append(lowerFDs, keep(fd))
	}
	rootFD, err := idmapped(upperRoot, userns)
	if err != nil {
		return -1, nil, err
	}
	keep(rootFD)
	var dirs [2]int
	for i, name := range []string{"upper", "work"} {
		fd, err := unix.Openat(rootFD, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return -1, nil, fmt.Errorf("open %s: %w", name, err)
		}
		dirs[i] = keep(fd)
	}
	fs, err := createOverlay(r, lowerFDs, dirs[0], dirs[1])
	if err != nil {
		return -1, nil, err
	}
	keep(fs)
	mfd, err = unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, nil, fmt.Errorf("fsmount: %w", err)
	}
	return keep(mfd), release, nil
}

// idmapped returns a detached clone of the mount at (or the directory)
// path, idmapped with userns.
func idmapped(path string, userns *os.File) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmap %s: %w", path, err)
	}
	return fd, nil
}

// createOverlay makes the overlay's superblock on a thread whose fsuid and
// fsgid are r.Base: overlayfs records its creator's credentials then and
// uses them for its own writes to the upper layer. The thread is thrown
// away afterwards (never unlocked), so no other goroutine runs with those
// credentials.
func createOverlay(r Range, lowers []int, upper, work int) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		fd, err := createOverlayLocked(r, lowers, upper, work)
		ch <- result{fd, err}
	}()
	res := <-ch
	return res.fd, res.err
}

func createOverlayLocked(r Range, lowers []int, upper, work int) (int, error) {
	bits, _, errno := syscall.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_SECUREBITS, 0, 0)
	if errno != 0 {
		return -1, fmt.Errorf("get securebits: %w", errno)
	}
	if _, _, errno := syscall.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, bits|secbitNoSetuidFixup, 0); errno != 0 {
		return -1, fmt.Errorf("set securebits: %w", errno)
	}
	// setfsuid reports the previous value, never an error.
	syscall.RawSyscall(unix.SYS_SETFSUID, uintptr(r.Base), 0, 0)
	syscall.RawSyscall(unix.SYS_SETFSGID, uintptr(r.Base), 0, 0)
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	set := func(key string, fd int) error {
		if err := unix.FsconfigSetFd(fs, key, fd); err != nil {
			return fmt.Errorf("overlay %s: %w", key, err)
		}
		return nil
	}
	for _, l := range lowers {
		if err := set("lowerdir+", l); err != nil {
			unix.Close(fs)
			if errors.Is(err, unix.EINVAL) {
				return -1, fmt.Errorf("%w (overlay layers as file descriptors need Linux 6.13)", err)
			}
			return -1, err
		}
	}
	err = set("upperdir", upper)
	if err == nil {
		err = set("workdir", work)
	}
	// As the plain overlay: the upper dir alone holds every change.
	for _, kv := range [][2]string{{"redirect_dir", "off"}, {"metacopy", "off"}} {
		if err == nil {
			if err = unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
				err = fmt.Errorf("overlay %s: %w", kv[0], err)
			}
		}
	}
	if err == nil {
		if err = unix.FsconfigCreate(fs); err != nil {
			err = fmt.Errorf("create overlay: %w", err)
		}
	}
	if err != nil {
		unix.Close(fs)
		return -1, err
	}
	return fs, nil
}

// ReadOnlyTree returns a detached, read-only clone of the directory (or
// mount) at path, idmapped with userns: the root a blank sandbox starts
// on before it takes its own layers.
func ReadOnlyTree(path string, userns *os.File) (int, error) {
	fd, err := idmapped(path, userns)
	if err != nil {
		return -1, err
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("read-only %s: %w", path, err)
	}
	return fd, nil
}
