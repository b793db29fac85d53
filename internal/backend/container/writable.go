package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/disk"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/idmap"
	"github.com/dsec-project/dsec/internal/mount"
)

// diskMB is the size of a sandbox's writable layer.
func diskMB(s backend.Spec) int64 {
	if s.Resources.DiskMB > 0 {
		return s.Resources.DiskMB
	}
	return defaultDiskMB
}

// upperDir is the sandbox's overlay upper dir, on its writable layer.
func (b *Backend) upperDir(id string) string { return filepath.Join(b.dir(id), "disk", "upper") }

// mountDisk makes sure the sandbox's writable layer is mounted at
// <dir>/disk with its upper and work dirs: a new image on create, the kept
// one after an edge restart.
func (b *Backend) mountDisk(ctx context.Context, rec *record) error {
	dir := b.dir(rec.Spec.ID)
	target := filepath.Join(dir, "disk")
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	mounted, err := mount.IsMountpoint(target)
	if err != nil {
		return err
	}
	if !mounted {
		img := filepath.Join(dir, "disk.img")
		if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
			if err := b.disks.Create(ctx, img, diskMB(rec.Spec)); err != nil {
				return err
			}
		} else if err := disk.Check(ctx, img); err != nil { // the node went down
			return err
		}
		if err := disk.Mount(img, target); err != nil {
			return err
		}
	}
	// Only root on the host, and the overlay, reach the upper dir.
	if err := os.Chmod(target, 0o700); err != nil {
		return fmt.Errorf("writable layer: %w", err)
	}
	// Owned by 0 on disk: root of the sandbox through the idmapped mount.
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(target, d), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("writable layer: %w", err)
		}
	}
	return nil
}

// detachedRootfs makes the sandbox's overlay over the writable layer
// mounted at upperRoot, every layer idmapped to the sandbox's id range, as
// a detached mount: root, valid until release is called.
func (b *Backend) detachedRootfs(rec *record, upperRoot string) (root int, release func(), err error) {
	ns, err := b.userns.get(rec.UIDs)
	if err != nil {
		return -1, nil, err
	}
	lowers := make([]string, len(rec.Lowers))
	for i, l := range rec.Lowers {
		lowers[i] = b.cloneSource(l)
	}
	return idmap.DetachedOverlay(rec.UIDs, ns, lowers, upperRoot)
}

// cloneSource returns the path to clone the layer at path from: for the
// runtime layer, its detached clone.
//
// The runtime layer is a directory of the edge's file system, not a mount
// of its own, and cloning a directory (open_tree) first checks every mount
// on that file system's mount for being locked over it — on a node, the
// writable layer of every live sandbox: 0.2–1 ms per clone at 1,300 live,
// twice per create (the blank's root and the claim's overlay). A detached
// clone has no mounts on it, so cloning it costs the same on any node
// (~10 µs). Linux 6.15 and newer clone a detached mount; on older ones
// runtimeTree is nil and the path is cloned.
func (b *Backend) cloneSource(path string) string {
	if path != b.runtime || b.runtimeTree == nil {
		return path
	}
	return fmt.Sprintf("/proc/self/fd/%d", b.runtimeTree.Fd())
}

// detachedTree returns a detached clone of dir that can itself be cloned,
// or nil (logged) if this kernel cannot clone a detached mount.
func detachedTree(dir string, log *slog.Logger) *os.File {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		log.Warn("clones of the runtime layer cost more on a fuller node", "err", err)
		return nil
	}
	probe, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		unix.Close(fd)
		log.Info("clones of the runtime layer cost more on a fuller node: this kernel does not clone a detached mount", "err", err)
		return nil
	}
	unix.Close(probe)
	return os.NewFile(uintptr(fd), dir)
}

// usernsCache keeps the user namespace that idmaps layers to each id
// range, made the first time the range is used. Making one clones a
// process, which copies the page tables of the whole edge; a range is
// used again by every reset of its sandbox and by later sandboxes. The
// namespace only describes the mapping for mount_setattr (each container
// gets its own user namespace from runc), so one per range is the same as
// one per mount. At most one per range of the node is kept.
type usernsCache struct {
	mu sync.Mutex
	m  map[uint32]*os.File
}

func (c *usernsCache) get(r idmap.Range) (*os.File, error) {
	c.mu.Lock()
	f, ok := c.m[r.Base]
	c.mu.Unlock()
	if ok {
		return f, nil
	}
	// Made outside the lock: creates of different ranges go on together.
	f, err := idmap.UserNS(r)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[r.Base]; ok {
		f.Close()
		return prev, nil
	}
	if c.m == nil {
		c.m = map[uint32]*os.File{}
	}
	c.m[r.Base] = f
	return f, nil
}

// allocUIDs reserves the lowest free id range for sandbox id (the lowest,
// so that the user namespaces cached per range stay as few as the most
// sandboxes the node held at once). The search starts at the lowest range
// that may be free rather than at the first, so that on a full node it
// does not walk past every range in use each time.
func (b *Backend) allocUIDs(id string) (idmap.Range, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := b.lowestFreeUIDs; i < b.cfg.MaxSandboxes; i++ {
		base := b.cfg.UIDBase + uint32(i)*idmap.Size
		if _, used := b.uids[base]; !used {
			b.uids[base] = id
			b.lowestFreeUIDs = i + 1
			return idmap.Range{Base: base}, nil
		}
	}
	return idmap.Range{}, fmt.Errorf("all %d id ranges of this node are in use: %w", b.cfg.MaxSandboxes, errdefs.ErrResourceExhausted)
}

// freeUIDs returns a sandbox's id range, if it still holds it.
func (b *Backend) freeUIDs(id string, r idmap.Range) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.uids[r.Base] == id {
		delete(b.uids, r.Base)
		if r.Base >= b.cfg.UIDBase {
			b.lowestFreeUIDs = min(b.lowestFreeUIDs, int((r.Base-b.cfg.UIDBase)/idmap.Size))
		}
	}
}

// traversable lets every id reach (not list) dir and its ancestors: runc
// mounts a sandbox's root file system from inside its user namespace, as
// an unprivileged host uid. Nothing is readable through o+x alone.
func traversable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := abs; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		if st.Mode&0o001 == 0 {
			if err := unix.Chmod(p, (st.Mode&0o7777)|0o001); err != nil {
				return fmt.Errorf("make %s traversable: %w", p, err)
			}
		}
		if p == "/" {
			return nil
		}
	}
}
