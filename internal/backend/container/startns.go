package container

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/mount"
)

// startNS is the mount namespace containers are started from: a private
// copy of the edge's namespace, made when the backend starts, stripped of
// every mount runc does not need — in particular of every sandbox's and
// layer's mount. `runc run` copies the mount table of the namespace it
// runs in (unshare(CLONE_NEWNS)), parses it several times (mountinfo),
// makes it a slave recursively and detaches it again after pivot_root:
// each step is linear in the number of mounts. Started from the edge's own
// namespace, where every live sandbox has its writable layer mounted, a
// create would cost more the fuller the node is; started from startNS it
// costs the same on a full node as on an empty one.
//
// Each start runs on a thread of its own that enters a fresh copy of
// startNS (so concurrent starts never see each other's mounts), attaches
// there the sandbox's root file system — a detached overlay, never
// mounted in the edge's namespace — at the bundle's rootfs path, and
// forks runc. The copy goes away with runc; the container keeps its own.
type startNS struct {
	fd int // an nsfs file descriptor of the namespace
	// sysfs is where the namespace has the sysfs sandboxes without an
	// interface bind at /sys (see sandboxFS); "" if it has none.
	sysfs string
}

// newStartNS makes the start namespace. keep lists the paths runc and the
// containers need to reach (the state root, the runc binary, the agent):
// the mounts holding them stay, with "/", /proc, /sys and /dev and what is
// mounted below those three (a container's new procfs and sysfs must not
// be more revealing than what its creator's namespace shows). Every other
// mount is detached from the copy, so that it holds no other file system
// busy (an unmounted loop device, a test's temporary mount) for the
// edge's lifetime, and so that its copies stay small. With sysfs set it
// then mounts there a sysfs of the network namespace pinned at netns (see
// sandboxFS); if that fails, sandboxes mount their own and the error is
// returned beside a working namespace.
func newStartNS(keep []string, sysfs, netns string) (*startNS, error) {
	for i, p := range keep {
		if abs, err := filepath.Abs(p); err == nil {
			if real, err := filepath.EvalSymlinks(abs); err == nil {
				abs = real
			}
			keep[i] = abs
		}
	}
	var res struct {
		fd       int
		err      error
		sysfsErr error
	}
	netnsFD := -1
	if sysfs != "" {
		// Opened here: the start namespace has no mount of the pin.
		if netnsFD, res.sysfsErr = unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0); res.sysfsErr != nil {
			res.sysfsErr = fmt.Errorf("open network namespace: %w", res.sysfsErr)
		} else {
			defer unix.Close(netnsFD)
		}
	}
	onThrowawayThread(func() {
		res.fd, res.err = makeStartNS(keep)
		if res.err == nil && netnsFD >= 0 {
			// Last: it leaves this thread in that network namespace.
			res.sysfsErr = mountNetnsSysfs(sysfs, netnsFD)
		}
	})
	if res.err != nil {
		return nil, fmt.Errorf("start namespace: %w", res.err)
	}
	s := &startNS{fd: res.fd}
	if res.sysfsErr != nil {
		return s, fmt.Errorf("start namespace: sysfs at %s: %w", sysfs, res.sysfsErr)
	}
	if netnsFD >= 0 {
		s.sysfs = sysfs
	}
	return s, nil
}

// Preconditions: runs on a thrown-away thread (onThrowawayThread).
func makeStartNS(keep []string) (int, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return -1, fmt.Errorf("unshare: %w", err)
	}
	// Private: what the edge mounts later never appears here, and what is
	// detached here never leaves.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, fmt.Errorf("make private: %w", err)
	}
	infos, err := mount.ThreadMountinfo()
	if err != nil {
		return -1, err
	}
	// Deepest first: a mount inside another would keep it busy.
	sort.SliceStable(infos, func(i, j int) bool {
		return strings.Count(infos[i].Mountpoint, "/") > strings.Count(infos[j].Mountpoint, "/")
	})
	for _, m := range infos {
		if startNSKeeps(m.Mountpoint, keep) {
			continue
		}
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return -1, fmt.Errorf("detach %s: %w", m.Mountpoint, err)
		}
	}
	fd, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open: %w", err)
	}
	return fd, nil
}

// startNSKeeps says whether the start namespace keeps the mount at mp.
func startNSKeeps(mp string, keep []string) bool {
	if mp == "/" {
		return true
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if mp == sys || strings.HasPrefix(mp, sys+"/") {
			return true
		}
	}
	for _, p := range keep {
		if p == mp || strings.HasPrefix(p, mp+"/") {
			return true // mp holds p
		}
	}
	return false
}

// run attaches root (a detached mount; the caller keeps and closes its
// descriptor) at rootfs in a fresh copy of the namespace and runs cmd
// there.
func (s *startNS) run(cmd *exec.Cmd, root int, rootfs string, background bool) error {
	var err error
	onThrowawayThread(func() { err = s.runLocked(cmd, root, rootfs, background) })
	return err
}

// onThrowawayThread runs f on an OS thread of its own that is thrown away
// afterwards, for f to change the thread's mount namespace. Never on the
// process's main thread: the Go runtime cannot end that one, and
// /proc/self shows that thread's namespace to the whole process.
func onThrowawayThread(f func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Holding the main thread, so that the retry runs elsewhere.
			onThrowawayThread(f)
			runtime.UnlockOSThread()
			close(done)
			return
		}
		f()
		close(done) // returns locked: the runtime ends the thread
	}()
	<-done
}

// Preconditions: runs on a thrown-away thread (onThrowawayThread).
//
// background starts cmd at nice backgroundNice (it inherits the thread's,
// as do its children): a blank sandbox of the pool is started with the
// CPU time the node's other work leaves (see startBlank).
func (s *startNS) runLocked(cmd *exec.Cmd, root int, rootfs string, background bool) error {
	if background {
		if err := setNice(0, backgroundNice); err != nil {
			return fmt.Errorf("start namespace: %w", err)
		}
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("start namespace: unshare fs: %w", err)
	}
	if err := unix.Setns(s.fd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("start namespace: enter: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("start namespace: copy: %w", err)
	}
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, rootfs, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("start namespace: attach the root file system: %w", err)
	}
	return cmd.Run()
}

// Close releases the namespace.
func (s *startNS) Close() error {
	if s == nil || s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("close start namespace: %w", os.NewSyscallError("close", err))
	}
	return nil
}
