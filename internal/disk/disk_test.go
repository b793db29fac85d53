package disk_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/disk"
	"github.com/dsec-project/dsec/internal/mount"
	"github.com/dsec-project/dsec/internal/testutil"
)

func require(t testing.TB) {
	testutil.Require(t, testutil.Root, testutil.Tool("mkfs.ext4"), testutil.File("/dev/loop-control"), testutil.Filesystem("ext4"))
}

// TestLimit: a file system of the size asked, full at that size, that
// costs the node only what was written and gives it back when deleted.
func TestLimit(t *testing.T) {
	require(t)
	dir := t.TempDir()
	tm, err := disk.NewTemplates(filepath.Join(dir, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if err := tm.Create(context.Background(), img, 32); err != nil {
		t.Fatal(err)
	}
	if used := allocated(t, img); used > 2<<20 {
		t.Fatalf("a fresh 32 MiB image takes %d bytes on the node", used)
	}
	if err := disk.Mount(img, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.Unmount(mnt) })

	f, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	var written int64
	for {
		n, err := f.Write(buf)
		written += int64(n)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if written > 64<<20 {
			t.Fatal("wrote past the limit without ENOSPC")
		}
	}
	f.Close()
	if written < 20<<20 {
		t.Fatalf("ENOSPC after only %d bytes of 32 MiB", written)
	}
	unix.Sync()
	if used := allocated(t, img); used > 34<<20 {
		t.Fatalf("the image takes %d bytes on the node for a 32 MiB disk", used)
	}
	os.Remove(filepath.Join(mnt, "fill"))
	// ext4 discards freed blocks once their transaction commits.
	testutil.Eventually(t, 10*time.Second, "deleted blocks given back", func() error {
		unix.Syncfs(int(mustOpen(t, mnt).Fd()))
		if used := allocated(t, img); used > 8<<20 {
			return fmt.Errorf("%d bytes", used)
		}
		return nil
	})
	if err := mount.Unmount(mnt); err != nil {
		t.Fatal(err)
	}
	if err := tm.Recreate(context.Background(), img, 32); err != nil {
		t.Fatal(err)
	}
}

func mustOpen(t *testing.T, p string) *os.File {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func allocated(t testing.TB, p string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// BenchmarkCreateMount is what a sandbox's size-limited writable layer
// costs at create: copy the template, attach a loop device, mount.
func BenchmarkCreateMount(b *testing.B) {
	require(b)
	dir := b.TempDir()
	tm, err := disk.NewTemplates(filepath.Join(dir, "templates"))
	if err != nil {
		b.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if err := tm.Create(context.Background(), filepath.Join(dir, "warm.img"), 10240); err != nil {
		b.Fatal(err)
	}
	var before, after unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &before)
	var tCopy, tMount time.Duration
	for i := 0; b.Loop(); i++ {
		img := filepath.Join(dir, strconv.Itoa(i)+".img")
		t0 := time.Now()
		if err := tm.Create(context.Background(), img, 10240); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := disk.Mount(img, mnt); err != nil {
			b.Fatal(err)
		}
		tCopy, tMount = tCopy+t1.Sub(t0), tMount+time.Since(t1)
		b.StopTimer()
		mount.Unmount(mnt)
		os.Remove(img)
		b.StartTimer()
	}
	unix.Getrusage(unix.RUSAGE_SELF, &after)
	cpu := func(r unix.Rusage) float64 { return float64(r.Utime.Nano()+r.Stime.Nano()) / 1e6 }
	b.ReportMetric((cpu(after)-cpu(before))/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(tCopy.Microseconds())/1000/float64(b.N), "copy-ms/op")
	b.ReportMetric(float64(tMount.Microseconds())/1000/float64(b.N), "loop+mount-ms/op")
}

// TestFormat: what keeps an idle sandbox's writable layer cheap for the
// node. Its ext4 has no journal (no jbd2 thread and journal memory per
// sandbox), has every inode table zeroed already (no ext4lazyinit work
// on each mount), and is mounted without reading every group's block
// bitmap up front.
func TestFormat(t *testing.T) {
	require(t)
	dir := t.TempDir()
	tm, err := disk.NewTemplates(filepath.Join(dir, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if err := tm.Create(context.Background(), img, 1024); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	le16 := func(off int) int { return int(raw[off]) | int(raw[off+1])<<8 }
	le32 := func(off int) int { return le16(off) | le16(off+2)<<16 }
	sb := 1024
	if magic := le16(sb + 0x38); magic != 0xEF53 {
		t.Fatalf("no ext4 superblock (magic %#x)", magic)
	}
	if compat := le32(sb + 0x5C); compat&0x4 != 0 {
		t.Fatal("the writable layer has a journal (has_journal)")
	}
	blockSize := 1024 << le32(sb+0x18)
	groups := (le32(sb+0x4) + le32(sb+0x20) - 1) / le32(sb+0x20)
	descSize := le16(sb + 0xFE)
	if descSize == 0 {
		descSize = 32
	}
	gdt := (le32(sb+0x14) + 1) * blockSize
	for g := range groups {
		if flags := le16(gdt + g*descSize + 0x12); flags&0x4 == 0 { // EXT4_BG_INODE_ZEROED
			t.Fatalf("group %d of %d: inode table not zeroed (flags %#x): every mount would zero it", g, groups, flags)
		}
	}

	if err := disk.Mount(img, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.Unmount(mnt) })
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == mnt {
			if !strings.Contains(f[len(f)-1], "no_prefetch_block_bitmaps") {
				t.Fatalf("mounted with %s: want no_prefetch_block_bitmaps", f[len(f)-1])
			}
			return
		}
	}
	t.Fatalf("%s is not in the mount table", mnt)
}
