package container

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/mount"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestFullNode fills a node with 300 live sandboxes and checks that it
// still creates, resets and destroys one; that the start namespace runc
// copies holds no sandbox's mount however full the node is, and the
// edge's namespace one per sandbox; and that destroying everything leaves
// no mount (in either namespace), loop device, cgroup, process or file.
func TestFullNode(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	const live = 300
	ctx := context.Background()
	root := t.TempDir()
	// The test's temporary directory has a random name: unique among the
	// tests of everyone on the machine.
	cgroupParent := "dsec-test-" + filepath.Base(filepath.Dir(root))
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, err := New(Config{Root: root, AgentPath: filepath.Join(testutil.Binaries(t), "dsec-agent"), CgroupParent: cgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		destroyAll(b)
		b.Close()
		testutil.UnmountAll(root)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+cgroupParent) {
			os.Remove(d)
		}
	})
	startMounts := len(startNSMounts(t, b, "/"))

	spec := func(id string) backend.Spec {
		return backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
			Resources: api.Resources{CPU: 0.05, MemoryMB: 32, Pids: 64, DiskMB: 16},
			Network:   api.Network{Mode: api.NetworkNone}}
	}
	ids := make([]string, live)
	for i := range ids {
		ids[i] = fmt.Sprintf("full-%03d", i)
	}
	if err := forEach(ids, func(id string) error { return b.Create(ctx, spec(id)) }); err != nil {
		t.Fatal(err)
	}

	// Full: one mount per sandbox (its writable layer) and the layer in
	// the edge's namespace, none of them where runc starts.
	if got := mountsUnder(t, root); len(got) != live+1 {
		t.Errorf("%d mounts under the backend's root with %d sandboxes, want %d (one writable layer each and the layer)", len(got), live, live+1)
	}
	if got := startNSMounts(t, b, root); len(got) != 0 {
		t.Errorf("the start namespace holds %d mounts under the backend's root: %v", len(got), got)
	}
	if n := len(startNSMounts(t, b, "/")); n != startMounts {
		t.Errorf("the start namespace has %d mounts with %d sandboxes, %d when empty", n, live, startMounts)
	}

	// Every root clones the runtime layer; cloning a directory first checks
	// every mount on its mount — here, every sandbox's writable layer — so
	// it is cloned from a detached clone nothing is mounted on.
	checkRuntimeSource(t, b)

	// Still creates, resets and destroys.
	one := "full-one"
	if err := b.Create(ctx, spec(one)); err != nil {
		t.Fatal(err)
	}
	if out := shell(t, b, one, "echo dirty > /dirt; cat /dirt"); out != "dirty\n" {
		t.Fatalf("new sandbox on a full node: %q", out)
	}
	if err := b.Reset(ctx, one); err != nil {
		t.Fatal(err)
	}
	if out := shell(t, b, one, "cat /dirt 2>&1; echo ok"); strings.Contains(out, "dirty") || !strings.HasSuffix(out, "ok\n") {
		t.Fatalf("after reset on a full node: %q", out)
	}
	if err := b.Destroy(ctx, one); err != nil {
		t.Fatal(err)
	}
	if out := shell(t, b, ids[0], "echo alive"); out != "alive\n" {
		t.Fatalf("oldest sandbox: %q", out)
	}

	if err := forEach(ids, func(id string) error { return b.Destroy(ctx, id) }); err != nil {
		t.Fatal(err)
	}
	for _, leak := range leaks(t, b, root, cgroupParent) {
		t.Error("leaked:", leak)
	}
}

// checkRuntimeSource checks that b clones its runtime layer from a mount
// of its own that is attached nowhere, and that holds the agent.
func checkRuntimeSource(t *testing.T, b *Backend) {
	t.Helper()
	src := b.cloneSource(b.runtime)
	if src == b.runtime {
		t.Fatalf("the runtime layer is cloned from its path %s", src)
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, src, 0, unix.STATX_MNT_ID, &stx); err != nil {
		t.Fatal(err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 || stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		t.Errorf("the runtime layer's clone source %s is not a mount's root", src)
	}
	infos, err := mount.Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range infos {
		if uint64(m.ID) == stx.Mnt_id {
			t.Errorf("the runtime layer's clone source is attached at %s", m.Mountpoint)
		}
	}
	if _, err := os.Stat(filepath.Join(src, agentPath)); err != nil {
		t.Errorf("the runtime layer's clone source has no agent: %v", err)
	}
}

// forEach runs f on every id, 8 at a time, and returns the first error.
func forEach(ids []string, f func(id string) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, 8)
	)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(id); err != nil {
				mu.Lock()
				first = cmp.Or(first, fmt.Errorf("%s: %w", id, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

func shell(t *testing.T, b *Backend, id, cmd string) string {
	t.Helper()
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
	defer ag.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := ag.Exec(ctx, &api.ExecRequest{Shell: cmd})
	if err != nil {
		t.Fatalf("exec in %s: %v", id, err)
	}
	return res.Stdout
}

// mountsUnder lists the mountpoints at or under dir in the process's
// namespace (the edge's), but for the pin of the shared sysfs's network
// namespace, which lives as long as the backend or its sandboxes do
// (pinNetns; TestSharedSysfs checks it goes).
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	infos, err := mount.MountsUnder(canonical(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	var mps []string
	for _, m := range infos {
		if m.Mountpoint != canonical(t, dir) && filepath.Base(m.Mountpoint) != sysfsPin {
			mps = append(mps, m.Mountpoint)
		}
	}
	return mps
}

// startNSMounts lists the mountpoints at or under dir in b's start
// namespace, but for its shared sysfs (see sandboxFS).
func startNSMounts(t *testing.T, b *Backend, dir string) []string {
	t.Helper()
	dir = canonical(t, dir)
	var (
		infos []mount.Info
		err   error
	)
	onThrowawayThread(func() {
		if err = unix.Unshare(unix.CLONE_FS); err != nil {
			return
		}
		if err = unix.Setns(b.startNS.fd, unix.CLONE_NEWNS); err != nil {
			return
		}
		infos, err = mount.ThreadMountinfo()
	})
	if err != nil {
		t.Fatal(err)
	}
	var mps []string
	for _, m := range infos {
		if b.startNS.sysfs != "" && m.Mountpoint == canonical(t, b.startNS.sysfs) {
			continue
		}
		if dir == "/" || m.Mountpoint == dir || strings.HasPrefix(m.Mountpoint, dir+"/") {
			mps = append(mps, m.Mountpoint)
		}
	}
	return mps
}

func canonical(t *testing.T, p string) string {
	t.Helper()
	c, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// leaks lists what the backend's sandboxes left behind, once its trash
// has removed what it was given. Some teardown ends in the kernel after
// the call that started it returned (a killed process still exiting, its
// memory gone, in its cgroup), so what is found is looked at again for a
// while before it counts.
func leaks(t *testing.T, b *Backend, root, cgroupParent string) []string {
	t.Helper()
	b.trash.wait()
	var out []string
	testutil.Poll(30*time.Second, func() error {
		if out = leaksNow(t, b, root, cgroupParent); len(out) > 0 {
			return errors.New("something left")
		}
		return nil
	})
	return out
}

// leaksNow lists what the backend's sandboxes have left behind now.
func leaksNow(t *testing.T, b *Backend, root, cgroupParent string) []string {
	t.Helper()
	var out []string
	for _, mp := range mountsUnder(t, root) {
		out = append(out, "mount "+mp)
	}
	if b.startNS.fd >= 0 { // not closed yet
		for _, mp := range startNSMounts(t, b, root) {
			out = append(out, "mount in the start namespace "+mp)
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(data), canonical(t, root)+"/") {
			out = append(out, "loop device on "+strings.TrimSpace(string(data)))
		}
	}
	for _, d := range []string{"sandboxes", "trash", "runc", "layers"} {
		entries, _ := os.ReadDir(filepath.Join(root, d))
		for _, e := range entries {
			out = append(out, "file "+filepath.Join(d, e.Name()))
		}
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent + "/*")
	more, _ := filepath.Glob("/sys/fs/cgroup/" + cgroupParent + "/*")
	spares := 0
	for _, cg := range append(cgroups, more...) {
		if st, err := os.Stat(cg); err == nil && st.IsDir() {
			// An open backend keeps emptied memory cgroups for its next
			// containers; Close removes them.
			if isSpare(filepath.Base(cg)) && b.startNS.fd >= 0 && filepath.Dir(cg) == b.runc.spares.dir {
				if procs, err := os.ReadFile(filepath.Join(cg, "cgroup.procs")); err == nil && len(procs) == 0 {
					spares++
					continue
				}
			}
			out = append(out, "cgroup "+cg)
		}
	}
	if spares > b.cfg.SpareMemcgs || spares != b.runc.spares.len() {
		out = append(out, fmt.Sprintf("%d spare memory cgroups, the backend keeps %d (at most %d)", spares, b.runc.spares.len(), b.cfg.SpareMemcgs))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(data), "/"+cgroupParent+"/") {
			continue
		}
		// A dead sandbox's init is reparented to the host's init, which
		// reaps it when it gets to it.
		if st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat")); err == nil && strings.Contains(string(st), ") Z ") {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		out = append(out, "process "+filepath.Base(filepath.Dir(p))+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	b.mu.Lock()
	if n := len(b.sandboxes) + len(b.uids); n > 0 {
		out = append(out, fmt.Sprintf("%d records or id ranges", n))
	}
	b.mu.Unlock()
	return out
}

// fileSystemsInside prints what a sandbox's scratch and masked file
// systems look like from inside: the distinct tmpfs superblocks, /dev/shm
// (mode, mount options, a file written), and for each masked directory
// its entries and whether a file can be made in it.
const fileSystemsInside = `awk '$9=="tmpfs"{print $3}' /proc/self/mountinfo | sort -u | wc -l;
awk '$9=="tmpfs"{print $5}' /proc/self/mountinfo | sort | tr '\n' ' '; echo;
stat -c '%%a' /dev/shm; awk '$5=="/dev/shm"{print $6}' /proc/self/mountinfo;
echo x > /dev/shm/f && cat /dev/shm/f && rm /dev/shm/f;
for d in %s; do echo "$d: $(ls -A $d | wc -l) entries, $(awk -v d=$d '$5==d{print $6}' /proc/self/mountinfo)";
  touch $d/x 2>/dev/null && echo "$d writable"; done`

// TestSandboxFileSystems checks that a sandbox's /dev/shm, masked
// directories and /sys/fs/cgroup cost no file system of their own — a
// tmpfs each was four of a sandbox's eleven superblocks, and every
// superblock on the host costs
// memory in every memory cgroup of the node — and still behave as runc's
// did: /dev/shm a world-writable sticky directory mounted nosuid, nodev
// and noexec; each masked directory empty, read-only and mounted. It does
// so for a cold sandbox, a claimed one, and both after a reset of a used
// sandbox (a fresh /dev, /proc and /sys moved).
func TestSandboxFileSystems(t *testing.T) {
	// See TestSharedSysfs for /sys and /sys/fs/cgroup.
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	var masked []string
	for _, d := range agent.MaskedDirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			masked = append(masked, d)
		}
	}
	if len(masked) == 0 {
		t.Fatalf("none of %v is on this host: nothing to check the masks on", agent.MaskedDirs)
	}
	var want strings.Builder
	fmt.Fprintf(&want, "1\n/dev /dev/shm \n1777\n")
	base := backendtest.MinimalLayer(t, t.TempDir())
	cold, _, _ := newTestBackend(t, PoolConfig{})
	warm, _, _ := newTestBackend(t, PoolConfig{Max: 1, Min: 1})
	waitPool(t, warm, 1)
	for name, b := range map[string]*Backend{"cold": cold, "claimed": warm} {
		id := "sb-fs-" + name
		if err := b.Create(ctx, backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
			Resources: api.Resources{MemoryMB: 48}, Network: api.Network{Mode: api.NetworkNone}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Destroy(context.Background(), id) })
		for _, when := range []string{"new", "after a reset"} {
			out := shell(t, b, id, fmt.Sprintf(fileSystemsInside, strings.Join(masked, " ")))
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) < 5+len(masked) {
				t.Fatalf("%s sandbox, %s: short output:\n%s", name, when, out)
			}
			if got := strings.Join(lines[:3], "\n") + "\n"; got != want.String() {
				t.Errorf("%s sandbox, %s: tmpfs superblocks, their mounts, /dev/shm's mode:\n%s\nwant:\n%s", name, when, got, want.String())
			}
			for _, o := range []string{"nosuid", "nodev", "noexec"} {
				if !slices.Contains(strings.Split(lines[3], ","), o) {
					t.Errorf("%s sandbox, %s: /dev/shm mounted %s, want %s", name, when, lines[3], o)
				}
			}
			if lines[4] != "x" {
				t.Errorf("%s sandbox, %s: a file in /dev/shm read back %q", name, when, lines[4])
			}
			for i, d := range masked {
				l := lines[5+i]
				if !strings.HasPrefix(l, d+": 0 entries, ro,") {
					t.Errorf("%s sandbox, %s: %s", name, when, l)
				}
			}
			if strings.Contains(out, "writable") {
				t.Errorf("%s sandbox, %s: a masked directory is writable:\n%s", name, when, out)
			}
			// Used (a file in /tmp), so the reset makes a fresh /dev and
			// moves /proc and /sys into a new root.
			shell(t, b, id, "echo used > /tmp/used")
			if err := b.Reset(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
}

const sysInside = `awk '$5=="/sys"{print $3, $9}' /proc/self/mountinfo;
ls /sys/class/net | tr '\n' ' '; echo; cat /sys/class/net/lo/operstate;
cat /sys/fs/cgroup/memory/memory.limit_in_bytes;
awk '$5=="/sys/fs/cgroup"{print $9}' /proc/self/mountinfo;
ls /sys/fs/cgroup | tr '\n' ' '; echo;
touch /sys/fs/cgroup/x /sys/fs/cgroup/memory/x 2>/dev/null && echo writable; echo end`

// TestSharedSysfs checks that sandboxes without an interface share one
// sysfs, of a network namespace holding only an up loopback (what each
// would see in a sysfs of its own), that it outlives the backend and its
// namespace's last process, and that /sys/fs/cgroup is no tmpfs but
// still shows each sandbox its own cgroups, read-only, in every
// hierarchy the host has — before and after a reset in place.
func TestSharedSysfs(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	hostSys := ""
	infos, err := mount.Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	var hierarchies []string
	for _, m := range infos {
		if m.Mountpoint == "/sys" {
			hostSys = fmt.Sprintf("%d:%d", m.Major, m.Minor)
		}
		if m.FSType == "cgroup" && filepath.Dir(m.Mountpoint) == "/sys/fs/cgroup" {
			hierarchies = append(hierarchies, filepath.Base(m.Mountpoint))
		}
	}
	if len(hierarchies) == 0 {
		t.Fatal("no cgroup v1 hierarchy on this host: nothing to check")
	}
	slices.Sort(hierarchies)
	base := backendtest.MinimalLayer(t, t.TempDir())
	// A backend of its own, closed and started again by the test.
	root := t.TempDir()
	parent := "dsec-test-" + filepath.Base(filepath.Dir(root))
	cfg := Config{Root: root, AgentPath: filepath.Join(testutil.Binaries(t), "dsec-agent"), CgroupParent: parent}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		destroyAll(b) // the last backend: b is reassigned below
		b.Close()
		testutil.UnmountAll(root)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+parent) {
			os.Remove(d)
		}
	})
	check := func(id string, memMB int64, when string) string {
		t.Helper()
		out := shell(t, b, id, sysInside)
		l := strings.Split(strings.TrimSpace(out), "\n")
		if len(l) != 7 || l[6] != "end" {
			t.Fatalf("%s, %s: output:\n%s", id, when, out)
		}
		sys := strings.Fields(l[0])
		if len(sys) != 2 || sys[1] != "sysfs" || sys[0] == hostSys {
			t.Errorf("%s, %s: /sys is %q, want a sysfs other than the host's (%s)", id, when, l[0], hostSys)
		}
		if strings.TrimSpace(l[1]) != "lo" || l[2] != "unknown" {
			t.Errorf("%s, %s: /sys/class/net %q, lo %q; want lo, unknown (up)", id, when, l[1], l[2])
		}
		if l[3] != strconv.FormatInt(memMB<<20, 10) {
			t.Errorf("%s, %s: /sys/fs/cgroup/memory shows a limit of %s, want its own %d MiB", id, when, l[3], memMB)
		}
		if l[4] == "tmpfs" {
			t.Errorf("%s, %s: /sys/fs/cgroup is a tmpfs", id, when)
		}
		if got := strings.Fields(l[5]); !slices.Equal(got, hierarchies) {
			t.Errorf("%s, %s: /sys/fs/cgroup holds %q, want %q", id, when, got, hierarchies)
		}
		if strings.Contains(out, "writable") {
			t.Errorf("%s, %s: /sys/fs/cgroup is writable", id, when)
		}
		return sys[0]
	}
	devs := map[string]bool{}
	for i, id := range []string{"sb-sys-a", "sb-sys-b"} {
		mem := int64(48 + 16*i)
		if err := b.Create(ctx, backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
			Resources: api.Resources{MemoryMB: mem}, Network: api.Network{Mode: api.NetworkNone}}); err != nil {
			t.Fatal(err)
		}
		devs[check(id, mem, "new")] = true
		shell(t, b, id, "echo used > /tmp/used")
		if err := b.Reset(ctx, id); err != nil {
			t.Fatal(err)
		}
		devs[check(id, mem, "after a reset")] = true
	}
	if len(devs) != 1 {
		t.Errorf("two sandboxes' /sys: %d superblocks, want 1 shared", len(devs))
	}

	// The namespace is pinned beside the backend's root: a backend closed
	// with sandboxes left keeps it, the next one uses it, and the last
	// close with none left removes it.
	pin := filepath.Join(root, "sysfs.net")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(pin, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		t.Fatalf("backend closed with sandboxes left: %s is no network namespace (%v)", pin, err)
	}
	if b, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	check("sb-sys-a", 48, "after the edge's restart")
	destroyAll(b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("last backend closed with no sandbox left: %s still there (%v)", pin, err)
	}
}
