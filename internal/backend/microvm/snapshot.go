package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/mount"
)

// snapshotFreeze bounds how long a guest stays frozen if the host dies
// while it packs.
const snapshotFreeze = 5 * time.Minute

// Snapshot freezes the sandbox's writable disk and calls pack with the
// directories that hold its changes, in overlayfs format: first the
// guest's upper dir, then, for flattening, its top merge read-only layers,
// top first. The guest's agent freezes its ext4 writable disk (every
// change and the journal flushed, writers blocked); the host attaches the
// disk image read-only to a loop device and mounts it (ext4, ro, noload)
// and mounts the layers it needs, all until pack returns. A paused
// sandbox is resumed for the freeze only, and is paused while pack runs.
func (b *Backend) Snapshot(ctx context.Context, id string, merge int, pack func(ctx context.Context, dirs []string) error) (err error) {
	v, err := b.get(id)
	if err != nil {
		return err
	}
	if v.Machine.Type == TypeQ35 {
		return errdefs.Invalid("sandbox %s is a full VM: its snapshot is a disk image (a vm layer), not a layer of changes", id)
	}
	if merge < 0 || merge > len(v.Spec.Layers) {
		return errdefs.Invalid("merge %d: the sandbox has %d layers", merge, len(v.Spec.Layers))
	}
	paused := v.link.paused.Load()
	if paused {
		if err := b.Resume(ctx, id); err != nil {
			return err
		}
	}
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return v.link.dial(ctx) })
	defer ag.Close()
	if err := ag.Freeze(ctx, snapshotFreeze); err != nil {
		if paused {
			b.Pause(context.WithoutCancel(ctx), id)
		}
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	if paused {
		if err := b.Pause(ctx, id); err != nil {
			ag.Thaw(context.WithoutCancel(ctx))
			return err
		}
	}
	defer func() {
		ctx := context.WithoutCancel(ctx)
		if paused {
			b.Resume(ctx, id)
		}
		if terr := ag.Thaw(ctx); terr != nil && err == nil {
			err = fmt.Errorf("snapshot %s: %w", id, terr)
		}
		if paused {
			b.Pause(ctx, id)
		}
	}()

	work, err := os.MkdirTemp(v.Machine.Dir, "snapshot-")
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	defer os.RemoveAll(work)
	var mounts []string
	defer func() {
		for i := len(mounts) - 1; i >= 0; i-- {
			mount.Unmount(mounts[i])
		}
	}()
	dev, fd, err := attachLoop(filepath.Join(v.Machine.Dir, "rw.img"))
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	defer unix.Close(fd)
	rw := filepath.Join(work, "rw")
	os.Mkdir(rw, 0o700)
	// noload: the frozen file system is clean; nothing may be replayed
	// into a disk the guest owns.
	if err := unix.Mount(dev, rw, "ext4", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "noload"); err != nil {
		return fmt.Errorf("snapshot %s: mount the writable disk: %w", id, err)
	}
	mounts = append(mounts, rw)
	dirs := []string{filepath.Join(rw, "upper")}
	for i := len(v.Spec.Layers) - 1; i >= len(v.Spec.Layers)-merge; i-- {
		mp := filepath.Join(work, "layer-"+strconv.Itoa(i))
		os.Mkdir(mp, 0o700)
		l := v.Spec.Layers[i]
		if err := mount.EROFSFrom(mount.Source{Image: l.Path, Device: l.Device, DirectIO: l.OnDemand}, mp); err != nil {
			return fmt.Errorf("snapshot %s: %w", id, err)
		}
		mounts = append(mounts, mp)
		dirs = append(dirs, mp)
	}
	if _, err := os.Stat(dirs[0]); err != nil {
		return fmt.Errorf("snapshot %s: the writable disk has no upper dir: %w", id, errors.Join(err, errdefs.ErrUnavailable))
	}
	return pack(ctx, dirs)
}
