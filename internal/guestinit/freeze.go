package guestinit

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// FIFREEZE and FITHAW: _IOWR('X', 119, int) and _IOWR('X', 120, int).
const (
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// Freezer freezes the guest's writable disk (an agent.Freezer): ext4
// flushes every change and its journal, and blocks writers, so that the
// host can read the disk image as a clean file system. It holds a
// descriptor of the disk's mount, opened before the switch of root (the
// mount is not reachable by path afterwards).
type Freezer struct {
	fd int

	mu     sync.Mutex
	frozen bool
	timer  *time.Timer
}

func openFreezer(dir string) (*Freezer, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	return &Freezer{fd: fd}, nil
}

// Freeze implements agent.Freezer.
func (f *Freezer) Freeze(timeout time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		return fmt.Errorf("the writable disk is already frozen: %w", errdefs.ErrFailedPrecondition)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(f.fd), ioctlFIFREEZE, 0); errno != 0 {
		return fmt.Errorf("freeze the writable disk: %w", errno)
	}
	f.frozen = true
	f.timer = time.AfterFunc(timeout, func() { f.Thaw() })
	return nil
}

// Thaw implements agent.Freezer. Thawing a disk that is not frozen is not
// an error.
func (f *Freezer) Thaw() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	if !f.frozen {
		return nil
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(f.fd), ioctlFITHAW, 0); errno != 0 && !errors.Is(errno, unix.EINVAL) {
		return fmt.Errorf("thaw the writable disk: %w", errno)
	}
	f.frozen = false
	return nil
}
