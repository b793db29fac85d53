package initramfs

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/internal/guestinit"
	"github.com/dsec-project/dsec/internal/testutil"
)

type entry struct {
	name       string
	mode, rdev uint32
	data       string
}

// readNewc parses a newc archive the way the kernel's unpacker does.
func readNewc(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d", off)
		}
		mode, size, rmaj, rmin, nameLen := field(1), int(field(6)), field(9), field(10), int(field(11))
		name := string(b[off+110 : off+110+nameLen-1])
		dataOff := align(off + 110 + nameLen)
		data := string(b[dataOff : dataOff+size])
		off = align(dataOff + size)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, entry{name, mode, rmaj<<8 | rmin, data})
	}
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.File("/etc/dsec/x", 0o644, 5, strings.NewReader("hello"))
	w.Symlink("bin/sh", "busybox")
	w.CharDev("dev/console", 0o600, 5, 1)
	w.Dir("/etc", 0o755) // already made as a parent: not repeated
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := readNewc(t, buf.Bytes())
	want := []entry{
		{"etc", modeDir | 0o755, 0, ""},
		{"etc/dsec", modeDir | 0o755, 0, ""},
		{"etc/dsec/x", modeFile | 0o644, 0, "hello"},
		{"bin", modeDir | 0o755, 0, ""},
		{"bin/sh", modeLink | 0o777, 0, "busybox"},
		{"dev", modeDir | 0o755, 0, ""},
		{"dev/console", modeChr | 0o600, 5<<8 | 1, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestWriterShortReader(t *testing.T) {
	w := NewWriter(io.Discard)
	if err := w.File("x", 0o644, 10, strings.NewReader("short")); err == nil {
		t.Fatal("a file shorter than its size was written")
	}
}

// TestBuildGuestInitramfs builds the real guest initramfs from the guest
// kernel package: modules come with their dependencies, before them.
func TestBuildGuestInitramfs(t *testing.T) {
	testutil.Require(t, testutil.GuestKernel)
	k, err := FindKernel(testutil.GuestKernelDir())
	if err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("#!/bin/true\n"), 0o755)
	var buf bytes.Buffer
	mods, err := Build(&buf, Config{Init: agent, Kernel: k, Modules: []string{"erofs", "virtio_blk", "overlay"}})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		pos[m.Name] = i
	}
	for _, dep := range [][2]string{{"virtio_ring", "virtio"}, {"virtio", "virtio_blk"}, {"libcrc32c", "erofs"}} {
		a, okA := pos[dep[0]]
		b, okB := pos[dep[1]]
		if okB && (!okA || a > b) {
			t.Errorf("%s must load before %s: order %v", dep[0], dep[1], mods)
		}
	}
	files := map[string]entry{}
	for _, e := range readNewc(t, buf.Bytes()) {
		files["/"+e.name] = e
	}
	if e := files[InitPath]; e.mode != modeFile|0o755 || e.data != "#!/bin/true\n" {
		t.Errorf("init: %+v", e)
	}
	if e := files["/dev/console"]; e.rdev != 5<<8|1 {
		t.Errorf("console: %+v", e)
	}
	order := strings.Fields(files[guestinit.ModuleOrder].data)
	if len(order) != len(mods) {
		t.Fatalf("module order %v, modules %v", order, mods)
	}
	for _, name := range order {
		if e, ok := files[guestinit.ModuleDir+"/"+name+".ko"]; !ok || !strings.HasPrefix(e.data, "\x7fELF") {
			t.Errorf("module %s missing or not an ELF object", name)
		}
	}
	if _, err := k.ResolveModules([]string{"no_such_module"}); err == nil {
		t.Error("an unknown module resolved")
	}
}
