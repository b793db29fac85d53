// Package idmap gives each sandbox its own range of host user and group
// ids: it makes user namespaces that hold a range's mapping (to idmap
// mounts with) and mounts a sandbox's overlay over idmapped layers, so that
// root inside a sandbox is an unprivileged, unique uid on the host while
// every layer image and every writable layer stays stored with its plain,
// unshifted ownership (0 is root on disk, whoever the sandbox is).
//
// It must never change the ownership of anything on disk, and never leave
// a mount attached anywhere but the target it is given.
package idmap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Size is how many ids each sandbox gets: a full 16-bit range, so that
// every uid a Linux distribution uses exists inside.
const Size = 65536

// Range is a block of Size host ids starting at Base, mapped to 0..Size-1
// inside a sandbox, for uids and gids alike.
type Range struct {
	Base uint32 `json:"base"`
}

// String is the range in the form of /proc/PID/uid_map.
func (r Range) String() string {
	return fmt.Sprintf("0 %d %d\n", r.Base, Size)
}

// UserNS returns a file descriptor of a new user namespace that maps the
// range, owned by the caller. It is only good for idmapping mounts: no
// process stays in it.
func UserNS(r Range) (*os.File, error) {
	pid, err := forkUserNS()
	if err != nil {
		return nil, fmt.Errorf("user namespace for %d: clone: %w", r.Base, err)
	}
	defer func() {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); !errors.Is(err, unix.EINTR) {
				break
			}
		}
	}()
	proc := "/proc/" + strconv.Itoa(pid)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(proc+"/"+f, []byte(r.String()), 0); err != nil {
			return nil, fmt.Errorf("user namespace for %d: %w", r.Base, err)
		}
	}
	f, err := os.Open(proc + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("user namespace for %d: %w", r.Base, err)
	}
	return f, nil
}

// forkUserNS clones a child into a new user namespace that only waits to
// be killed. The child runs no Go code: between clone and its death it
// only makes raw system calls, on the stack frame it was cloned with.
func forkUserNS() (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, errno := rawCloneUserNS()
	if errno != 0 {
		return 0, errno
	}
	return int(pid), nil
}

//go:noinline
//go:norace
//go:nosplit
func rawCloneUserNS() (uintptr, syscall.Errno) {
	pid, _, errno := syscall.RawSyscall6(unix.SYS_CLONE, uintptr(unix.CLONE_NEWUSER|unix.SIGCHLD), 0, 0, 0, 0, 0)
	if errno != 0 || pid != 0 {
		return pid, errno
	}
	// The child: die with the parent, then wait for SIGKILL.
	syscall.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0)
	for {
		syscall.RawSyscall(unix.SYS_PAUSE, 0, 0, 0)
	}
}
