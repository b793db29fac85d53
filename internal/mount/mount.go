// Package mount makes the kernel mounts an edge node needs for sandbox
// root file systems: file-backed EROFS mounts of layer images, shared by
// every sandbox on the node through the reference-counted Layers pool, and
// one overlayfs per sandbox on top of them.
//
// It calls mount(2) directly and must never shell out to mount(8), which
// would quietly put a loop device under every EROFS image. It must never
// unmount anything outside the directories it is given.
package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/errdefs"
)

// layerFlags are the flags of a layer mount. A sandbox only ever sees a
// layer through its overlay, and the overlay's own mount decides whether
// devices open, setuid applies and files execute there (checked on this
// kernel: whiteouts, opaque dirs, setuid binaries and exec all work through
// an overlay whose lowers are nodev,nosuid,noexec). So a layer mount is
// locked down for whoever reaches it directly on the host.
const layerFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOEXEC

// overlayFlags are the flags of a sandbox overlay. nodev: a tenant's layer
// may hold any device node, and nothing in a sandbox needs to open one from
// its root file system (a sandbox gets its own /dev). Overlay whiteouts are
// 0/0 devices, but overlayfs only inspects them, never opens them, so they
// keep working. Not nosuid: sudo and ping in base images must keep working.
const overlayFlags = unix.MS_NODEV

// Source is what an EROFS layer mount reads: the image file, and for a
// chunked layer the file holding its data (mkfs.erofs --blobdev), which
// EROFS opens as an extra device.
type Source struct {
	// Image is the EROFS image: a whole layer, or a chunked layer's
	// metadata image.
	Image string `json:"image"`
	// Device, if set, is the data blob: a file on node disk, or a blobfs
	// file read on demand.
	Device string `json:"device,omitempty"`
	// DirectIO makes EROFS read the files with direct I/O, bypassing their
	// page cache: for a blobfs device, whose pages EROFS would otherwise
	// cache twice (once for the FUSE file, once for itself).
	DirectIO bool `json:"directio,omitempty"`
}

// options is the mount(2) data string of src.
func (src Source) options() (string, error) {
	var opts []string
	if src.Device != "" {
		// The option string separates with ','; our paths are generated,
		// so refuse rather than escape.
		if strings.ContainsAny(src.Device, ",\\") {
			return "", errdefs.Invalid("device path %q contains ',' or '\\'", src.Device)
		}
		opts = append(opts, "device="+src.Device)
	}
	if src.DirectIO {
		opts = append(opts, "directio")
	}
	s := strings.Join(opts, ",")
	// mount(2) copies at most one page of options, NUL included.
	if limit := os.Getpagesize() - 1; len(s) > limit {
		return "", errdefs.Invalid("erofs options are %d bytes, more than a page", len(s))
	}
	return s, nil
}

// EROFS mounts the EROFS image file source read-only at target, as a
// file-backed mount: no loop device.
func EROFS(source, target string) error {
	return EROFSFrom(Source{Image: source}, target)
}

// EROFSFrom mounts src read-only at target, as a file-backed mount: the
// image and the device are regular files (or blobfs files), never loop
// devices.
func EROFSFrom(src Source, target string) error {
	opts, err := src.options()
	if err != nil {
		return fmt.Errorf("mount erofs %s on %s: %w", src.Image, target, err)
	}
	err = unix.Mount(src.Image, target, "erofs", layerFlags, opts)
	if errors.Is(err, unix.ENOTBLK) {
		return fmt.Errorf("mount erofs %s on %s: the kernel cannot mount EROFS from a file (needs Linux 6.12 with CONFIG_EROFS_FS_BACKED_BY_FILE): %w", src.Image, target, err)
	}
	if err != nil {
		return fmt.Errorf("mount erofs %s (%s) on %s: %w", src.Image, opts, target, err)
	}
	return nil
}

// Overlay mounts an overlayfs at target with lowers (top first) under the
// writable upper and work directories, which must be on one file system.
// With upper and work both empty the overlay is read-only. redirect_dir and
// metacopy are off so the upper directory alone holds every change, ready
// to be snapshotted as a layer.
func Overlay(lowers []string, upper, work, target string) error {
	opts, err := overlayOptions(lowers, upper, work)
	if err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	flags := uintptr(overlayFlags)
	if upper == "" {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}

func overlayOptions(lowers []string, upper, work string) (string, error) {
	if len(lowers) == 0 {
		return "", errdefs.Invalid("overlay needs at least one lower directory")
	}
	if (upper == "") != (work == "") {
		return "", errdefs.Invalid("overlay needs both an upper and a work directory, or neither")
	}
	if upper == "" && len(lowers) < 2 {
		// overlayfs refuses it ("at least 2 lowerdir are needed").
		return "", errdefs.Invalid("read-only overlay needs at least two lower directories")
	}
	for _, p := range append([]string{upper, work}, lowers...) {
		// The option string separates with ',' and lowers with ':'. Our
		// paths are generated, so refuse rather than escape.
		if strings.ContainsAny(p, ",:\\") {
			return "", errdefs.Invalid("overlay path %q contains ',', ':' or '\\'", p)
		}
	}
	opts := "lowerdir=" + strings.Join(lowers, ":")
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	}
	opts += ",redirect_dir=off,metacopy=off"
	// mount(2) copies at most one page of options, NUL included.
	if limit := os.Getpagesize() - 1; len(opts) > limit {
		return "", errdefs.Invalid("overlay options are %d bytes, more than the %d a page holds: use shorter or fewer layer paths", len(opts), limit)
	}
	return opts, nil
}

// Unmount unmounts target. A busy mount is retried for about a second,
// then detached lazily (it goes once its last user does). A target that is
// not mounted, or does not exist, is success.
func Unmount(target string) error {
	delay := 10 * time.Millisecond
	for deadline := time.Now().Add(time.Second); ; {
		err := unix.Unmount(target, 0)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case !errors.Is(err, unix.EBUSY):
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(delay)
		delay = min(2*delay, 200*time.Millisecond)
	}
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s (detach): %w", target, err)
	}
	return nil
}

// IsMountpoint reports whether path is the root of a mount.
func IsMountpoint(path string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_BASIC_STATS, &stx)
	if err != nil {
		return false, fmt.Errorf("is mountpoint %s: %w", path, err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	// Kernels before 5.8 do not report it.
	return inMountinfo(path)
}

// inMountinfo reports whether mountinfo lists a mount at path.
func inMountinfo(path string) (bool, error) {
	// mountinfo shows canonical paths.
	canonical, err := filepath.EvalSymlinks(path)
	if err == nil {
		canonical, err = filepath.Abs(canonical)
	}
	if err != nil {
		return false, fmt.Errorf("is mountpoint %s: %w", path, err)
	}
	under, err := MountsUnder(canonical)
	if err != nil {
		return false, fmt.Errorf("is mountpoint %s: %w", path, err)
	}
	for _, m := range under {
		if m.Mountpoint == canonical {
			return true, nil
		}
	}
	return false, nil
}
