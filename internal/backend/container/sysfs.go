package container

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/mount"
)

// A sandbox's /sys and /sys/fs/cgroup cost no superblock of their own.
//
// Every superblock on the host costs memory in every memory cgroup of the
// node (docs/ARCHITECTURE.md, "Superblocks cost memory in every memory
// cgroup"), so on a node of n sandboxes each superblock a sandbox has costs
// ~n/64 KiB in every sandbox. runc would give each container a sysfs (one
// per network namespace) and, on a cgroup v1 host, a tmpfs at
// /sys/fs/cgroup to hold the hierarchies' mount points. Instead:
//
//   - A sandbox without a network interface gets a read-only bind of one
//     sysfs that the start namespace mounts from a network namespace of
//     its own, holding nothing but a loopback: what every such sandbox's
//     own sysfs would show (the rest of sysfs is not per namespace), with
//     the statistics of that namespace's idle loopback. A sandbox with an
//     interface mounts its own, to see it.
//   - /sys/fs/cgroup is a read-only bind of the runtime layer's
//     .dsec/cgroup, which holds a mount point (and runc's symbolic links)
//     for each of the host's cgroup v1 hierarchies, and each hierarchy is
//     a read-only bind of the container's own cgroup there: what runc's
//     cgroup mount binds, without its tmpfs.

// cgroupSkeleton is the runtime layer's directory of mount points for the
// host's cgroup v1 hierarchies.
const cgroupSkeleton = ".dsec/cgroup"

// v1Hierarchies are the cgroup v1 hierarchies mounted directly under
// cgroupRoot, as runc would mount them into a container: their directory
// names, and the symbolic links beside them that name one (the
// controllers of a co-mounted hierarchy: cpu -> cpu,cpuacct).
type v1Hierarchies struct {
	dirs  []string
	links map[string]string
}

// hostV1Hierarchies reads the host's cgroup v1 hierarchies from the
// mount table; none on a cgroup v2 host.
func hostV1Hierarchies() (v1Hierarchies, error) {
	infos, err := mount.Mountinfo()
	if err != nil {
		return v1Hierarchies{}, err
	}
	h := v1Hierarchies{links: map[string]string{}}
	for _, m := range infos {
		if m.FSType == "cgroup" && filepath.Dir(m.Mountpoint) == cgroupRoot {
			h.dirs = append(h.dirs, filepath.Base(m.Mountpoint))
		}
	}
	slices.Sort(h.dirs)
	h.dirs = slices.Compact(h.dirs)
	entries, _ := os.ReadDir(cgroupRoot)
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		if to, err := os.Readlink(filepath.Join(cgroupRoot, e.Name())); err == nil && slices.Contains(h.dirs, to) {
			h.links[e.Name()] = to
		}
	}
	return h, nil
}

// String names the hierarchies for the runtime layer's hash.
func (h v1Hierarchies) String() string {
	s := strings.Join(h.dirs, ",")
	for _, l := range slices.Sorted(maps.Keys(h.links)) {
		s += " " + l + "->" + h.links[l]
	}
	return s
}

// makeSkeleton lays out the mount points in a new runtime layer at dir.
func (h v1Hierarchies) makeSkeleton(dir string) error {
	root := filepath.Join(dir, cgroupSkeleton)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	for _, d := range h.dirs {
		if err := os.Mkdir(filepath.Join(root, d), 0o555); err != nil {
			return err
		}
	}
	for l, to := range h.links {
		if err := os.Symlink(to, filepath.Join(root, l)); err != nil {
			return err
		}
	}
	return os.Chmod(root, 0o555)
}

// sandboxFS is how a container's /sys and /sys/fs/cgroup are made.
type sandboxFS struct {
	// sysfs is the start namespace's sysfs, bound at /sys of a sandbox
	// without an interface; "": each sandbox mounts its own.
	sysfs string
	// cgroups are the host's v1 hierarchies, bound from the container's
	// own cgroups over the runtime layer's skeleton; none: runc's cgroup
	// mount (a cgroup v2 host's is one superblock-free cgroup2 mount).
	cgroups v1Hierarchies
}

// fsFor is how the container of rec, started on the runtime layer
// runtime, gets its /sys and /sys/fs/cgroup. A runtime layer of an older
// dsec has no skeleton: its sandboxes get runc's cgroup mount.
func (b *Backend) fsFor(rec *record, runtime string) sandboxFS {
	var fs sandboxFS
	if !rec.Spec.NeedsNetwork && b.startNS != nil {
		fs.sysfs = b.startNS.sysfs
	}
	if len(b.cgroups.dirs) > 0 {
		if _, err := os.Stat(filepath.Join(runtime, cgroupSkeleton)); err == nil {
			fs.cgroups = b.cgroups
		}
	}
	return fs
}

// sysMounts are a container's /sys mounts (see sandboxFS), for a
// container whose cgroups are at cgroupsPath in every hierarchy.
func (fs sandboxFS) sysMounts(runtime, cgroupsPath string) []specs.Mount {
	ro := []string{"nosuid", "noexec", "nodev", "ro"}
	var ms []specs.Mount
	if fs.sysfs != "" {
		ms = append(ms, specs.Mount{Destination: "/sys", Type: "bind", Source: fs.sysfs, Options: append([]string{"bind"}, ro...)})
	} else {
		ms = append(ms, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: ro})
	}
	if len(fs.cgroups.dirs) == 0 {
		return append(ms, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
	}
	ms = append(ms, specs.Mount{Destination: "/sys/fs/cgroup", Type: "bind", Source: filepath.Join(runtime, cgroupSkeleton), Options: append([]string{"bind"}, ro...)})
	for _, d := range fs.cgroups.dirs {
		ms = append(ms, specs.Mount{
			Destination: "/sys/fs/cgroup/" + d, Type: "bind",
			Source:  filepath.Join(cgroupRoot, d, cgroupsPath),
			Options: append([]string{"bind"}, ro...),
		})
	}
	return ms
}

// The shared sysfs's network namespace is pinned by a bind mount of it
// on a file beside the sysfs's mount point, in the edge's namespace:
// sysfs holds only a passive reference to the namespace it shows, so
// with no process left in it the namespace would be dismantled and every
// sandbox's /sys/class/net would be empty. The pin outlives the edge, as
// the sandboxes that bind the sysfs do, and is reused by the next; Close
// removes it once no sandbox is left.

// sysfsPin is the pin's name in the backend's root.
const sysfsPin = "sysfs.net"

// pinNetns makes path a bind mount of a new network namespace, unless it
// already is one (an earlier run's, whose sandboxes may live on).
func pinNetns(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err == nil && st.Type == unix.NSFS_MAGIC {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o400)
	if err != nil {
		return err
	}
	f.Close()
	onThrowawayThread(func() {
		if err = unix.Unshare(unix.CLONE_NEWNET); err != nil {
			err = fmt.Errorf("new network namespace: %w", err)
			return
		}
		// Up, as runc sets it in every container's: sysfs shows its state.
		var lo netlink.Link
		if lo, err = netlink.LinkByName("lo"); err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			err = fmt.Errorf("loopback up: %w", err)
			return
		}
		if err = unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			err = fmt.Errorf("pin network namespace: %w", err)
		}
	})
	return err
}

// unpinNetns undoes pinNetns.
func unpinNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpin network namespace: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// mountNetnsSysfs mounts at dir a read-only sysfs of the network
// namespace netns (an nsfs descriptor).
//
// Preconditions: runs on a thrown-away thread (onThrowawayThread), in
// the mount namespace the mount is for.
func mountNetnsSysfs(dir string, netns int) error {
	if err := unix.Setns(netns, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter network namespace: %w", err)
	}
	if err := unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount sysfs: %w", err)
	}
	return nil
}
