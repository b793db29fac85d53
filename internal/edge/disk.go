package edge

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// diskReserve is what the node keeps free of the filesystem holding the
// sandboxes' writable layers, so that the host's filesystem never fills:
// 5% of it, at least 1 GiB. Its capacity for sandboxes is the rest, and
// a node whose free space is down to the reserve takes no new sandbox.
func diskReserve(sizeMB int64) int64 { return max(sizeMB/20, 1024) }

// diskStat is the filesystem holding dir: its size as this process can
// use it (what is used plus what is available to it, so that blocks
// reserved for root elsewhere do not count) and what is used, in MB.
func diskStat(dir string) (sizeMB, usedMB int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bs := uint64(st.Bsize)
	used := (st.Blocks - st.Bfree) * bs
	return int64((used + st.Bavail*bs) >> 20), int64(used >> 20), nil
}

// diskCapacityMB is what the node offers sandboxes' writable layers on
// the filesystem holding dir: its size less the reserve.
func diskCapacityMB(dir string) (int64, error) {
	size, _, err := diskStat(dir)
	if err != nil {
		return 0, err
	}
	return max(size-diskReserve(size), 0), nil
}

// checkDisk refuses a new sandbox when the writable-layer filesystem's
// free space is down to the reserve: the control plane's view is a
// heartbeat old, the filesystem is now.
func (e *Edge) checkDisk() error {
	if e.cfg.DiskDir == "" {
		return nil
	}
	size, used, err := diskStat(e.cfg.DiskDir)
	if err != nil {
		return nil // the create itself will tell
	}
	if free, reserve := size-used, diskReserve(size); free <= reserve {
		return fmt.Errorf("node %s: the disk of its sandboxes' writable layers is full: %d MB free of %d MB, and it keeps %d MB free: %w",
			e.cfg.NodeID, free, size, reserve, errdefs.ErrResourceExhausted)
	}
	return nil
}

// measureDisk fills in the heartbeat's disk figures; nothing when the
// node reports no disk.
func (e *Edge) measureDisk(l *api.NodeLoad) {
	if e.cfg.DiskDir == "" {
		return
	}
	size, used, err := diskStat(e.cfg.DiskDir)
	if err != nil {
		return
	}
	l.DiskUsedMB, l.DiskFull = used, size-used <= diskReserve(size)
}
