package microvm

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// attachLoop attaches file read-only to a free loop device, which detaches
// itself once the returned descriptor is closed and nothing mounts it.
// ext4 mounts only from a block device: the host reads a VM's writable
// disk image this way for a snapshot.
func attachLoop(file string) (dev string, fd int, err error) {
	backing, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("loop: open %s: %w", file, err)
	}
	defer unix.Close(backing)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("loop: %w", err)
	}
	defer unix.Close(ctl)
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("loop: get a free device: %w", err)
		}
		dev = fmt.Sprintf("/dev/loop%d", n)
		fd, err = openDevice(dev)
		if err != nil {
			return "", -1, err
		}
		cfg := unix.LoopConfig{Fd: uint32(backing)}
		cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY | unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err == nil {
			return dev, fd, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) {
			return "", -1, fmt.Errorf("loop: configure %s: %w", dev, err)
		}
		// Someone else took it between GET_FREE and CONFIGURE.
	}
	return "", -1, errors.New("loop: no free device after 20 attempts")
}

// openDevice opens a device node that udev or devtmpfs may still be
// making.
func openDevice(dev string) (int, error) {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil || !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			if err != nil {
				return -1, fmt.Errorf("loop: open %s: %w", dev, err)
			}
			return fd, nil
		}
	}
}
