package container

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestSpareMemoryCgroups: a destroyed sandbox's memory cgroup is kept, up
// to the configured number, and the next sandbox starts in it — with its
// own limits, at most spareKeep of what was charged to it before, and its
// peak and failure counters cleared, outside and as seen from inside. What
// it carries is not evicted: page cache that other sandboxes share stays.
// The spares beyond the bound are removed, and Close removes the rest.
func TestSpareMemoryCgroups(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"),
		testutil.File("/sys/fs/cgroup/memory/memory.force_empty"))
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, root, parent := newTestBackendConfig(t, Config{SpareMemcgs: 2})
	memParent := filepath.Join("/sys/fs/cgroup/memory", parent)
	spec := func(id string, memMB int64) backend.Spec {
		return backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
			Resources: api.Resources{CPU: 0.5, MemoryMB: memMB, DiskMB: 256}, Network: api.Network{Mode: api.NetworkNone}}
	}
	ino := func(dir string) uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	num := func(path string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(readTrim(t, path), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A test that fails half way still takes its sandboxes down.
	t.Cleanup(func() {
		for _, id := range []string{"sp-a", "sp-b", "sp-c", "sp-d", "sp-e"} {
			b.Destroy(context.Background(), id)
		}
	})
	spareNames := func() []string {
		t.Helper()
		var out []string
		entries, err := os.ReadDir(memParent)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() && isSpare(e.Name()) {
				out = append(out, e.Name())
				if procs := readTrim(t, filepath.Join(memParent, e.Name(), "cgroup.procs")); procs != "" {
					t.Errorf("spare %s holds processes %s", e.Name(), procs)
				}
			}
		}
		return out
	}

	// The first tenant fills its 64 MiB with page cache.
	if err := b.Create(ctx, spec("sp-a", 64)); err != nil {
		t.Fatal(err)
	}
	if out := shell(t, b, "sp-a", "dd if=/dev/zero of=/f bs=1M count=160 2>/dev/null && sync && echo ok"); out != "ok\n" {
		t.Fatalf("dd: %q", out)
	}
	dirA := filepath.Join(memParent, "sp-a")
	inoA := ino(dirA)
	if n := num(filepath.Join(dirA, "memory.max_usage_in_bytes")); n < 48<<20 {
		t.Fatalf("the first tenant's peak is %d bytes, not near its limit", n)
	}
	if err := b.Destroy(ctx, "sp-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dirA); !os.IsNotExist(err) {
		t.Fatalf("the destroyed sandbox's memory cgroup is still named for it: %v", err)
	}
	if got := spareNames(); len(got) != 1 || b.runc.spares.len() != 1 {
		t.Fatalf("spares after a destroy: %v (backend keeps %d), want 1", got, b.runc.spares.len())
	}
	// Page cache outlives its writer's sandbox (a layer's files, read
	// first by it): 32 MiB of it is charged to the spare.
	files := t.TempDir()
	// The destroyed sandbox's files go in the background and uncharge
	// the spare as they go: let them, before its charge is measured.
	b.trash.wait()
	chargeSpare(t, filepath.Join(memParent, spareNames()[0]), filepath.Join(files, "big"), 32)

	// The next sandbox starts in it.
	if err := b.Create(ctx, spec("sp-b", 32)); err != nil {
		t.Fatal(err)
	}
	dirB := filepath.Join(memParent, "sp-b")
	if ino(dirB) != inoA {
		t.Fatal("the second sandbox did not get the spare memory cgroup")
	}
	if got := spareNames(); len(got) != 0 {
		t.Errorf("spares left after a create took one: %v", got)
	}
	const limit = 32 << 20
	for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		if _, err := os.Stat(filepath.Join(dirB, f)); err == nil {
			if n := num(filepath.Join(dirB, f)); n != limit {
				t.Errorf("%s = %d, want %d", f, n, limit)
			}
		}
	}
	if n := num(filepath.Join(dirB, "memory.failcnt")); n != 0 {
		t.Errorf("the second tenant inherits %d failures", n)
	}
	// The agent and the first command charge a few MiB; the 32 MiB of page
	// cache left to the spare must not be among them.
	if n := num(filepath.Join(dirB, "memory.max_usage_in_bytes")); n > 16<<20 {
		t.Errorf("the second tenant's peak is %d bytes: the last tenant's", n)
	}
	inside := shell(t, b, "sp-b", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory/memory.failcnt; ls /f 2>&1 >/dev/null | wc -l")
	if want := strconv.Itoa(limit) + "\n0\n1\n"; inside != want {
		t.Errorf("inside the second sandbox: %q, want %q", inside, want)
	}

	// What a spare carries within spareKeep stays in memory: the next
	// tenant starts with it charged, not evicted (it is what the node's
	// other sandboxes read too).
	if err := b.Destroy(ctx, "sp-b"); err != nil {
		t.Fatal(err)
	}
	small := filepath.Join(files, "small")
	b.trash.wait()
	chargeSpare(t, filepath.Join(memParent, spareNames()[0]), small, 1)
	if err := b.Create(ctx, spec("sp-c", 16)); err != nil {
		t.Fatal(err)
	}
	if in, all := resident(t, small); in != all {
		t.Errorf("%d of the %d pages a spare carried are left in memory after the next create took it", in, all)
	}

	// At most SpareMemcgs are kept.
	for _, id := range []string{"sp-d", "sp-e"} {
		if err := b.Create(ctx, spec(id, 16)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"sp-c", "sp-d", "sp-e"} {
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if got := spareNames(); len(got) != 2 || b.runc.spares.len() != 2 {
		t.Errorf("spares after three destroys: %v (backend keeps %d), want 2", got, b.runc.spares.len())
	}
	for _, leak := range leaks(t, b, root, parent) {
		t.Error("leaked:", leak)
	}
	b.Close()
	if got := spareNames(); len(got) != 0 {
		t.Errorf("spares left after Close: %v", got)
	}
	for _, leak := range leaks(t, b, root, parent) {
		t.Error("leaked after Close:", leak)
	}
}

// chargeSpare charges mb MiB of page cache to the empty memory cgroup
// spare: a process in it writes them to file and exits, and the pages stay
// in memory, clean, charged to it.
func chargeSpare(t *testing.T, spare, file string, mb int) {
	t.Helper()
	script := fmt.Sprintf("echo $$ > %s/cgroup.procs && dd if=/dev/urandom of=%s bs=1M count=%d 2>/dev/null && sync %s", spare, file, mb, file)
	if out, err := exec.Command("/bin/sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("charge %d MiB to %s: %v: %s", mb, spare, err, out)
	}
	if in, all := resident(t, file); in != all {
		t.Fatalf("only %d of %d pages of %s are in memory after writing it", in, all, file)
	}
	// Which memory cgroup each page is charged to, not the cgroup's usage
	// before and after: the previous tenant's leftovers in the spare may
	// be reclaimed meanwhile (this machine's DAMON pages out what is
	// cold), and the difference then says less than was charged.
	if in, all := chargedTo(t, file, spare); in < all*3/4 {
		t.Fatalf("only %d of the %d pages of %s are charged to %s (is it in memory, not on a disk?)", in, all, file, spare)
	}
}

// chargedTo returns how many of file's pages in memory are charged to
// the memory cgroup memcg (/proc/self/pagemap, /proc/kpagecgroup; root
// only), and how many are in memory.
func chargedTo(t *testing.T, file, memcg string) (in, all int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(memcg, &st); err != nil {
		t.Fatal(err)
	}
	m, unmap := mapFile(t, file)
	defer unmap()
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pagemap.Close()
	kpc, err := os.Open("/proc/kpagecgroup")
	if err != nil {
		t.Fatal(err)
	}
	defer kpc.Close()
	page := os.Getpagesize()
	var touched byte
	var e [8]byte
	for off := 0; off < len(m); off += page {
		touched += m[off] // maps the page: pagemap shows mapped pages only
		addr := uintptr(unsafe.Pointer(&m[off]))
		if _, err := pagemap.ReadAt(e[:], int64(addr/uintptr(page)*8)); err != nil {
			t.Fatal(err)
		}
		v := binary.LittleEndian.Uint64(e[:])
		if v>>63 == 0 { // not present
			continue
		}
		all++
		if _, err := kpc.ReadAt(e[:], int64(v&(1<<55-1)*8)); err != nil {
			t.Fatal(err)
		}
		if binary.LittleEndian.Uint64(e[:]) == st.Ino {
			in++
		}
	}
	runtime.KeepAlive(touched)
	return in, all
}

// mapFile maps all of file, read-only and shared, until unmap: a page
// mapped is one the kernel is slow to reclaim, which the callers' checks
// must not lean on.
func mapFile(t *testing.T, file string) (m []byte, unmap func()) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err = unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	return m, func() { unix.Munmap(m) }
}

// resident returns how many of file's pages are in the page cache.
func resident(t *testing.T, file string) (in, all int) {
	t.Helper()
	m, unmap := mapFile(t, file)
	defer unmap()
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal("mincore:", errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			in++
		}
	}
	return in, len(vec)
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestRecoverSweepsBlankCgroups: the cgroups a blank sandbox's start left
// when it was killed half way (runc had made them, not yet its state) are
// removed by the next edge's recovery — in every hierarchy, the commands'
// child too — while a live sandbox's cgroups, and a blank's that still
// holds a process, stay.
func TestRecoverSweepsBlankCgroups(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	b, _, parent := newTestBackend(t, PoolConfig{Min: 1, Max: 1})
	waitPool(t, b, 1)
	spec := backend.Spec{ID: "sw-live", Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: api.Resources{CPU: 0.5, MemoryMB: 32, DiskMB: 16}, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), spec.ID) })
	st, err := b.runc.readState(spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox is a claimed blank: its cgroup v2 directory keeps the
	// blank's name, and the sweep must know it is a live sandbox's (its
	// commands' child, empty, is what the sweep would remove first).
	claimed := 0
	for _, dir := range st.CgroupPaths {
		if strings.HasPrefix(filepath.Base(dir), poolPrefix) {
			claimed++
			child := filepath.Join(dir, cmdCgroup)
			if err := os.Mkdir(child, 0o755); err == nil {
				t.Cleanup(func() { os.Remove(child) })
			} else if !os.IsExist(err) {
				t.Fatal(err)
			}
		}
	}
	if claimed == 0 && testutil.InCI() {
		t.Fatalf("no cgroup of the claimed sandbox keeps a blank's name (no cgroup v2 hierarchy?): %v", st.CgroupPaths)
	}
	var dead []string
	for _, dir := range st.CgroupPaths {
		d := filepath.Join(filepath.Dir(dir), "pool-dead")
		if err := os.MkdirAll(filepath.Join(d, cmdCgroup), 0o755); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, d)
		t.Cleanup(func() { os.Remove(filepath.Join(d, cmdCgroup)); os.Remove(d) })
	}
	busy := filepath.Join("/sys/fs/cgroup/pids", parent, "pool-busy")
	if err := os.Mkdir(busy, 0o755); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sleeper.Process.Kill()
		sleeper.Wait()
		os.Remove(busy)
	})
	if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}

	if _, err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range dead {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("a dead blank's cgroup %s is left: %v", d, err)
		}
	}
	if _, err := os.Stat(busy); err != nil {
		t.Errorf("a blank cgroup that holds a process was removed: %v", err)
	}
	for _, dir := range st.CgroupPaths {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("the live sandbox's cgroup: %v", err)
		}
		if strings.HasPrefix(filepath.Base(dir), poolPrefix) {
			if _, err := os.Stat(filepath.Join(dir, cmdCgroup)); err != nil {
				t.Errorf("the sweep went into the live sandbox's cgroup %s: %v", dir, err)
			}
		}
	}
	if out := shell(t, b, spec.ID, "echo alive"); out != "alive\n" {
		t.Errorf("live sandbox after recovery: %q", out)
	}
	if err := b.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
}
