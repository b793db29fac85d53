package idmap_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/idmap"
	"github.com/dsec-project/dsec/internal/mount"
	"github.com/dsec-project/dsec/internal/testutil"
)

// setup makes a lower dir with a root-owned private file and an upper root
// with upper/ and work/.
func setup(t testing.TB) (lower, upperRoot, target string) {
	t.Helper()
	testutil.Require(t, testutil.Root, testutil.Filesystem("overlay"), testutil.Tool("setpriv"))
	dir := t.TempDir()
	// The range's root must reach the overlay (as runc does in a sandbox).
	os.Chmod(dir, 0o711)
	os.Chmod(filepath.Dir(dir), 0o711)
	lower, upperRoot, target = filepath.Join(dir, "lower"), filepath.Join(dir, "disk"), filepath.Join(dir, "rootfs")
	for _, d := range []string{lower + "/etc", upperRoot + "/upper", upperRoot + "/work", target} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(lower+"/etc/secret", []byte("s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return lower, upperRoot, target
}

// TestOverlay: through the idmapped overlay, on-disk root is the range's
// base; what the range's root writes lands on disk as uid 0; another id
// range cannot read private files.
func TestOverlay(t *testing.T) {
	lower, upperRoot, target := setup(t)
	r := idmap.Range{Base: 3 << 24}
	ns, err := idmap.UserNS(r)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := idmap.Overlay(r, ns, []string{lower}, upperRoot, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.Unmount(target) })
	var st unix.Stat_t
	if err := unix.Stat(target+"/etc/secret", &st); err != nil || st.Uid != r.Base || st.Gid != r.Base {
		t.Fatalf("owner seen through the overlay: %d:%d %v", st.Uid, st.Gid, err)
	}
	as := func(uid uint32, script string) (string, error) {
		cmd := exec.Command("setpriv", "--reuid", itoa(uid), "--regid", itoa(uid), "--clear-groups", "sh", "-c", script)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := as(r.Base, "cat "+target+"/etc/secret && echo new > "+target+"/etc/new && mkdir "+target+"/d"); err != nil {
		t.Fatalf("the range's root: %v %s", err, out)
	}
	for _, p := range []string{"etc/new", "d"} {
		if err := unix.Stat(filepath.Join(upperRoot, "upper", p), &st); err != nil || st.Uid != 0 {
			t.Fatalf("%s on disk: uid %d %v", p, st.Uid, err)
		}
	}
	if out, err := as(r.Base+idmap.Size, "cat "+target+"/etc/secret"); err == nil || !strings.Contains(out, "denied") {
		t.Fatalf("another range read a private file: %v %s", err, out)
	}
}

func itoa(u uint32) string { return strconv.FormatUint(uint64(u), 10) }

// BenchmarkUserNSAndOverlay is what a sandbox's root file system costs
// over a plain overlay: a user namespace and the idmapped mounts.
func BenchmarkUserNSAndOverlay(b *testing.B) {
	lower, upperRoot, target := setup(b)
	r := idmap.Range{Base: 3 << 24}
	defer reportCPU(b)()
	for b.Loop() {
		ns, err := idmap.UserNS(r)
		if err != nil {
			b.Fatal(err)
		}
		if err := idmap.Overlay(r, ns, []string{lower}, upperRoot, target); err != nil {
			b.Fatal(err)
		}
		ns.Close()
		b.StopTimer() // unmounting waits for RCU grace periods: not ours
		mount.Unmount(target)
		b.StartTimer()
	}
}

// BenchmarkPlainOverlay is the baseline: the overlay sandboxes had before.
func BenchmarkPlainOverlay(b *testing.B) {
	lower, upperRoot, target := setup(b)
	defer reportCPU(b)()
	for b.Loop() {
		if err := mount.Overlay([]string{lower}, upperRoot+"/upper", upperRoot+"/work", target); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		mount.Unmount(target)
		b.StartTimer()
	}
}

// BenchmarkUserNS is the user namespace alone.
func BenchmarkUserNS(b *testing.B) {
	testutil.Require(b, testutil.Root)
	defer reportCPU(b)()
	for b.Loop() {
		ns, err := idmap.UserNS(idmap.Range{Base: 3 << 24})
		if err != nil {
			b.Fatal(err)
		}
		ns.Close()
	}
}

// reportCPU reports the process's CPU time per operation, which a busy
// machine distorts less than wall time. Unmounts are included: they are
// cheap in CPU, only slow to wait for.
func reportCPU(b *testing.B) func() {
	var before unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &before)
	return func() {
		var after unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &after)
		cpu := func(r unix.Rusage) float64 {
			return float64(r.Utime.Nano()+r.Stime.Nano()) / 1e6
		}
		b.ReportMetric((cpu(after)-cpu(before))/float64(b.N), "cpu-ms/op")
	}
}
