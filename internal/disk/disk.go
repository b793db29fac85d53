// Package disk gives each sandbox a writable layer of bounded size: an ext4
// file system of exactly the size asked for, on a sparse image file of its
// own, mounted through a loop device. A sandbox that fills it gets ENOSPC
// inside; the node's disk holds only the blocks the sandbox really wrote
// (mounted with discard, deleted blocks are punched out of the image).
//
// Images are not made by mkfs on the create path: each size is formatted
// once per node into a template (a few hundred KiB of metadata in a sparse
// file) and new images copy the template's data extents. This kernel has
// no quota format for ext4 project quotas (CONFIG_QFMT_V2) and no XFS
// quotas, which would otherwise let one file system serve every sandbox.
//
// The package must never mount anything but the images it is given, and
// never write outside its template directory and those images.
package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// templateVersion names the current template format, so that a node
// whose templates an older dsec made formats them again (with a journal,
// or with inode tables left to the kernel to zero at every mount).
const templateVersion = ".v2"

// MountOptions are the ext4 options a writable layer is mounted with:
// discard, so that deleted blocks go back to the node; remount read-only
// on an error; and no_prefetch_block_bitmaps: by default the kernel reads
// every group's block bitmap (80 of them for 10 GiB, 320 KiB of the loop
// device's page cache, and a kernel thread's work) at mount, to be ready
// for big allocations an idle sandbox never makes; a bitmap is read
// when a group is first allocated from instead.
const MountOptions = "discard,errors=remount-ro,no_prefetch_block_bitmaps"

// Templates makes sparse ext4 images from per-size templates kept in a
// directory.
type Templates struct {
	dir string

	mu    sync.Mutex // guards building a template
	ready map[int64]string
}

// NewTemplates keeps templates in dir.
func NewTemplates(dir string) (*Templates, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk templates: %w", err)
	}
	return &Templates{dir: dir, ready: map[int64]string{}}, nil
}

// template returns the template image of sizeMB, formatting it first if
// needed.
func (t *Templates) template(ctx context.Context, sizeMB int64) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.ready[sizeMB]; ok {
		return p, nil
	}
	p := filepath.Join(t.dir, strconv.FormatInt(sizeMB, 10)+"m"+templateVersion+".ext4")
	if _, err := os.Stat(p); err != nil {
		// A template of an older format (an earlier dsec on this node):
		// new images never use it again.
		os.Remove(filepath.Join(t.dir, strconv.FormatInt(sizeMB, 10)+"m.ext4"))
		tmp := p + ".tmp"
		os.Remove(tmp)
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return "", fmt.Errorf("disk template: %w", err)
		}
		err = f.Truncate(sizeMB << 20)
		f.Close()
		if err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("disk template: %w", err)
		}
		// No resize inode (its reserved blocks are most of a fresh
		// image), no blocks reserved for root (a sandbox's root is the
		// only user), and no journal: it triples the cost of mount and
		// unmount (a jbd2 thread each, and the journal's memory for as
		// long as the sandbox lives), and a sandbox's scratch layer does
		// not outlive a host crash without a check anyway (Mount runs
		// e2fsck on an image it finds unmounted but used).
		//
		// Inode tables zeroed now, once (lazy_itable_init=0): on a sparse
		// file mke2fs "discards" them by punching holes, which costs
		// nothing and lets it mark every group ITABLE_ZEROED. Otherwise
		// every mount of every copy would have the kernel's ext4lazyinit
		// thread zero ~160 MB of inode tables of a 10 GiB layer (a
		// write-zeroes through the loop device per group) behind the
		// create's back.
		cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0",
			"-O", "^resize_inode,^has_journal", "-E", "lazy_itable_init=0", tmp)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("disk template of %d MB: mkfs.ext4: %w: %s", sizeMB, err, out)
		}
		if err := os.Rename(tmp, p); err != nil {
			return "", fmt.Errorf("disk template: %w", err)
		}
	}
	t.ready[sizeMB] = p
	return p, nil
}

// Create writes a new image of sizeMB at path (which must not exist): an
// empty ext4 file system.
func (t *Templates) Create(ctx context.Context, path string, sizeMB int64) error {
	tmpl, err := t.template(ctx, sizeMB)
	if err != nil {
		return err
	}
	if err := sparseCopy(tmpl, path); err != nil {
		os.Remove(path)
		return fmt.Errorf("disk image %s: %w", path, err)
	}
	return nil
}

// Recreate replaces the image at path, which must not be mounted, with an
// empty one of the same size: what a reset does to a writable layer.
func (t *Templates) Recreate(ctx context.Context, path string, sizeMB int64) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disk image %s: %w", path, err)
	}
	return t.Create(ctx, path, sizeMB)
}

// sparseCopy copies the data extents of src into a new file dst of the
// same size, leaving holes as holes.
func sparseCopy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(st.Size()); err != nil {
		return err
	}
	inFD, outFD := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(inFD, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(inFD, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		for pos := data; pos < hole; {
			ipos, opos := pos, pos
			n, err := unix.CopyFileRange(inFD, &ipos, outFD, &opos, int(hole-pos), 0)
			if err != nil {
				return fmt.Errorf("copy range: %w", err)
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			pos += int64(n)
		}
		off = hole
	}
	return out.Close()
}

// Check repairs an image that was in use when its node went down (a
// file system without a journal is not clean after a crash).
func Check(ctx context.Context, image string) error {
	out, err := exec.CommandContext(ctx, "e2fsck", "-p", image).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return nil // errors corrected
	}
	if err != nil {
		return fmt.Errorf("check disk %s: %w: %s", image, err, out)
	}
	return nil
}

// Mount attaches image to a free loop device and mounts its ext4 at
// target. The loop device goes away by itself when target is unmounted.
func Mount(image, target string) error {
	dev, err := attachLoop(image)
	if err != nil {
		return fmt.Errorf("mount disk %s: %w", image, err)
	}
	defer dev.Close() // the mount keeps the device; autoclear does the rest
	err = unix.Mount(dev.Name(), target, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, MountOptions)
	if err != nil {
		return fmt.Errorf("mount disk %s on %s: %w", image, target, err)
	}
	return nil
}

// attachLoop binds image to a free loop device, with autoclear and direct
// I/O (no second copy of the data in the page cache), and returns the
// open device.
func attachLoop(image string) (*os.File, error) {
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	for range 100 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("get free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Size: 4096}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EINVAL) {
			// The image's file system takes no direct I/O of this block
			// size: buffered, the data is cached twice, but it works.
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		}
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("configure loop%d: %w", n, err)
		}
		// Someone else took it between GET_FREE and CONFIGURE.
	}
	return nil, errors.New("no free loop device after 100 tries")
}
