// Package testutil holds what dsec's tests share: the one way a test states
// what it needs from the machine. Locally a missing requirement skips the
// test; under CI (CI=true) it fails it, so nothing silently stops being
// tested. It must never be imported by non-test code.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A Requirement reports why the machine cannot run a test, or "" if it can.
type Requirement func() string

// Require checks every requirement and skips (locally) or fails (CI=true)
// the test on the first that is not met. Under `make test-unit`
// (DSEC_TEST_UNIT=1) a test that states any requirement is not a unit test:
// it is skipped whether or not the machine meets it, also under CI, where
// the full run that follows runs it.
func Require(t testing.TB, reqs ...Requirement) {
	t.Helper()
	if UnitOnly() && len(reqs) > 0 {
		t.Skip("skipping in the unit run: the test needs more than Go (make test runs it)")
	}
	for _, r := range reqs {
		if why := r(); why != "" {
			if InCI() {
				t.Fatalf("requirement not met under CI: %s", why)
			}
			t.Skipf("skipping: %s", why)
		}
	}
}

// UnitOnly reports whether only unit tests run (make test-unit): tests
// that need root, a tool beyond Go or the kernel's features skip.
func UnitOnly() bool { return os.Getenv("DSEC_TEST_UNIT") == "1" }

// InCI reports whether the tests run under CI, where skips are failures.
func InCI() bool { return os.Getenv("CI") == "true" }

// Root requires uid 0.
func Root() string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	return ""
}

// Tool requires an executable on PATH.
func Tool(name string) Requirement {
	return func() string {
		if _, err := exec.LookPath(name); err != nil {
			return fmt.Sprintf("needs %s on PATH", name)
		}
		return ""
	}
}

// Filesystem requires the kernel to know a filesystem type.
func Filesystem(fstype string) Requirement {
	return func() string {
		b, err := os.ReadFile("/proc/filesystems")
		if err != nil {
			return "cannot read /proc/filesystems"
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && f[len(f)-1] == fstype {
				return ""
			}
		}
		// Modules may still load on first mount; let the test try.
		if _, err := os.Stat("/lib/modules"); err == nil {
			return ""
		}
		return fmt.Sprintf("kernel lacks the %s filesystem", fstype)
	}
}

// File requires a path to exist (a device node, a socket).
func File(path string) Requirement {
	return func() string {
		if _, err := os.Stat(path); err != nil {
			return fmt.Sprintf("needs %s", path)
		}
		return ""
	}
}

// Short skips long tests under `go test -short`, even in CI.
func Short(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping in -short mode")
	}
}
