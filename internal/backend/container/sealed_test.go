package container

import (
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/internal/testutil"
)

// TestSealedRuncCopy: the copy of runc the backend executes carries exactly
// the seals runc looks for (with any other set runc would copy itself
// again at every start), cannot be written, and runs.
func TestSealedRuncCopy(t *testing.T) {
	testutil.Require(t, testutil.Tool("runc"))
	path, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	f, exe, err := sealedCopy(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// runc 1.1's RUNC_MEMFD_SEALS, compared for equality.
	want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals != want {
		t.Fatalf("seals %#x, %v; want %#x", seals, err, want)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("the sealed copy of runc took a write")
	}
	out, err := exec.Command(exe, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "runc version") {
		t.Fatalf("%s --version: %v: %s", exe, err, out)
	}
}
