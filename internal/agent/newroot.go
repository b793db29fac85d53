package agent

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// devNodes are the device files runc binds into a user-namespaced
// container's /dev from the host; a reset binds them again from the old
// /dev into the new one.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// devLinks are runc's /dev symbolic links.
var devLinks = [][2]string{
	{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
	{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"},
}

// switchRoot makes the detached mount mfd the root of the calling thread's
// mount namespace (and so of every process in it), with the calling
// thread in a new IPC namespace if newIPC. The caller is the only process
// left and its thread is locked: the IPC namespace is the thread's own
// until it re-executes the agent.
//
// With over, the new root is mounted over the current one and the process
// chroots into it, instead of pivot_root(2): pivot_root moves the root of
// every task on the host whose root is the old one, walking all of the
// host's threads under tasklist_lock, so on a full node (10,000 threads)
// it costs milliseconds and stalls every fork and exit meanwhile. Only a
// blank's claim uses it: the root left beneath is the blank's, a read-only
// clone of the runtime layer, bare once the old /dev is detached. A tenant
// that climbs out of a chroot (chroot into a subdirectory, then "..")
// reaches the old root's top, which the new root covers, and so lands in
// its own root again (TestClaimedRootCoversTheBlanks). A reset of a used
// sandbox pivots, dropping the tenant's old root with everything it wrote.
func switchRoot(mfd int, newIPC, over bool) error {
	if newIPC {
		if err := unix.Unshare(unix.CLONE_NEWIPC); err != nil {
			return fmt.Errorf("new ipc namespace: %w", err)
		}
	}
	var suffix [8]byte
	rand.Read(suffix[:])
	// The stage lives on the old /dev, which goes with the old root.
	stage := "/dev/.dsec-root-" + hex.EncodeToString(suffix[:])
	if err := unix.Mkdir(stage, 0o700); err != nil {
		return fmt.Errorf("stage: %w", err)
	}
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, stage, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach new root: %w", err)
	}
	if err := freshDev(stage); err != nil {
		return err
	}
	if err := moveMounts(stage); err != nil {
		return err
	}
	if err := unix.Chdir(stage); err != nil {
		return fmt.Errorf("pivot: %w", err)
	}
	if over {
		return chrootOver()
	}
	// pivot_root(".", ".") stacks the old root on the new one; detaching
	// it then leaves the new root alone.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("pivot: %w", err)
	}
	return nil
}

// chrootOver moves the new root, the working directory, over the old root
// and makes it the process's root, as runc does without pivot_root. Every
// mount of the old root but /dev was moved into the new one; the old /dev
// (the stage's directory, the device nodes' source) is detached, so the
// old root is left bare beneath.
func chrootOver() error {
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("mount new root over the old: %w", err)
	}
	// A path from the root still starts in the old root: a mount on the
	// root itself is crossed only by "..", not by a lookup from it.
	if err := unix.Unmount("/dev", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old /dev: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return nil
}

// freshDev mounts a new /dev in root as runc makes one (see the container
// backend's OCI spec): tmpfs, the host's device nodes bound from the old
// /dev, runc's links, a new devpts instance, the new IPC namespace's mqueue
// and an empty /dev/shm (see FinishContainer).
func freshDev(root string) error {
	dev := filepath.Join(root, "dev")
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return err
	}
	for _, n := range devNodes {
		var st unix.Stat_t
		if err := unix.Lstat("/dev/"+n, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue // runc did not make it either
		}
		fd, err := unix.Open(filepath.Join(dev, n), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
		if err != nil {
			return fmt.Errorf("new /dev: %w", err)
		}
		unix.Close(fd)
		if err := mount("/dev/"+n, filepath.Join(dev, n), "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for _, l := range devLinks {
		if err := unix.Symlink(l[0], filepath.Join(dev, l[1])); err != nil {
			return fmt.Errorf("new /dev: %w", err)
		}
	}
	if _, err := os.Lstat("/proc/kcore"); err == nil { // as runc decides
		if err := unix.Symlink("/proc/kcore", filepath.Join(dev, "core")); err != nil {
			return fmt.Errorf("new /dev: %w", err)
		}
	}
	for _, m := range []struct {
		dir, src, fstype string
		flags            uintptr
		data             string
	}{
		{"pts", "devpts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"mqueue", "mqueue", "mqueue", unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV, ""},
	} {
		p := filepath.Join(dev, m.dir)
		if err := unix.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("new /dev: %w", err)
		}
		if err := mount(m.src, p, m.fstype, m.flags, m.data); err != nil {
			return err
		}
	}
	return shmDir(filepath.Join(dev, "shm"))
}

// A container sandbox's /dev/shm and masked directories are made by its
// agent rather than by runc, without a file system of their own. runc
// mounts a tmpfs for /dev/shm and one for each masked directory: three
// superblocks of a sandbox's eleven. Every superblock on the host is a
// memory-cgroup-aware shrinker, and every memory cgroup on the node keeps
// a slot for each shrinker id the host ever used (the kernel's
// shrinker_info, 1 KiB per 64 ids), so each superblock a sandbox adds
// costs memory in every other sandbox's cgroup — a cost per sandbox that
// grows with the node's size (docs/ARCHITECTURE.md, "Memory of an idle
// sandbox").

// MaskedDirs are runc's default masked paths that are directories. A
// container's agent masks them with read-only binds of the runtime
// layer's empty directory (EmptyDir); the container's spec masks only
// the files.
var MaskedDirs = []string{"/proc/acpi", "/proc/asound", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"}

// EmptyDir is an empty, read-only directory of the runtime layer.
const EmptyDir = "/.dsec/empty"

// FinishContainer makes what runc no longer makes in a container sandbox,
// before the agent serves: /dev/shm (a directory of /dev's tmpfs, bound
// over itself with nosuid, nodev and noexec) and the masks of MaskedDirs.
// Either already mounted (by runc, from an older edge's spec) is left as
// it is.
func FinishContainer() error {
	if err := shmDir("/dev/shm"); err != nil {
		return err
	}
	for _, d := range MaskedDirs {
		if err := maskDir(d); err != nil {
			return err
		}
	}
	return nil
}

// shmDir makes path a world-writable sticky directory bound over itself
// with nosuid, nodev and noexec: a mount of its parent's file system, not
// a file system of its own. The space is /dev's (64 MiB, as /dev/shm's own
// was).
func shmDir(path string) error {
	if root, err := isMountRoot(path); err == nil && root {
		return nil
	}
	if err := unix.Mkdir(path, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := unix.Chmod(path, 0o1777); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := mount(path, path, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// maskDir covers the directory path, if there is one, with a read-only
// bind of EmptyDir (a read-only tmpfs, as runc masks, when the runtime
// layer has no EmptyDir).
func maskDir(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil // nothing to mask, or a file (the spec masks those)
	}
	if root, err := isMountRoot(path); err != nil || root {
		return err
	}
	if _, err := os.Stat(EmptyDir); err != nil {
		return mount("tmpfs", path, "tmpfs", unix.MS_RDONLY, "")
	}
	if err := mount(EmptyDir, path, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// isMountRoot reports whether path is the root of a mount.
func isMountRoot(path string) (bool, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_BASIC_STATS, &stx); err != nil {
		return false, err
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, errors.New("statx: no mount root attribute")
	}
	return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// moveMounts moves every mount attached directly on the old root — /proc,
// /sys, the runtime directory, resolv.conf, each with the mounts beneath
// it (runc's masked and read-only paths) — to the same place under root;
// /dev is made fresh instead.
func moveMounts(root string) error {
	mounts, err := topMounts()
	if err != nil {
		return err
	}
	for _, mp := range mounts {
		if mp == "/dev" || strings.HasPrefix(mp, "/dev/") {
			continue
		}
		dst := filepath.Join(root, mp)
		var st unix.Stat_t
		if err := unix.Stat(mp, &st); err != nil {
			return fmt.Errorf("move %s: %w", mp, err)
		}
		if err := mountpoint(dst, st.Mode&unix.S_IFMT == unix.S_IFDIR); err != nil {
			return fmt.Errorf("move %s: %w", mp, err)
		}
		if err := mount(mp, dst, "", unix.MS_MOVE, ""); err != nil {
			return err
		}
	}
	return nil
}

// mountpoint makes sure path exists, as a directory or an empty file. It
// never follows a symbolic link out of the new root: the new root is
// fresh, and nothing else runs.
func mountpoint(path string, dir bool) error {
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if dir {
		return unix.Mkdir(path, 0o755)
	}
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// topMounts lists the mount points attached directly on the root mount,
// in mount order.
func topMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type m struct{ id, parent, point string }
	var all []m
	rootID := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		point := unescape(fields[4])
		all = append(all, m{fields[0], fields[1], point})
		if point == "/" {
			rootID = fields[0] // the last one mounted on / is the root
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if rootID == "" {
		return nil, errors.New("mountinfo: no root mount")
	}
	var out []string
	for _, x := range all {
		if x.parent == rootID && x.point != "/" {
			out = append(out, x.point)
		}
	}
	return out, nil
}

// unescape decodes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mount(src, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", src, target, err)
	}
	return nil
}
