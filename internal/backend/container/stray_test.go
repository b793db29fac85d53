package container

import (
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/testutil"
)

// TestStrayIsNotOurs: a runc command on the backend's state root that a
// previous edge left running is a stray, one this process started (the
// pool's, filling while recovery looks) is not.
func TestStrayIsNotOurs(t *testing.T) {
	testutil.Require(t, testutil.Tool("bash"))
	root := t.TempDir()
	r := runc{bin: "runc", root: root}
	// sh with argv[0] "runc": what /proc shows of a runc command; the
	// trailing ':' keeps sh from exec'ing sleep in its place.
	ours := &exec.Cmd{Path: "/bin/sh", Args: []string{"runc", "-c", "sleep 600; :", "x", "--root", root}}
	if err := ours.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ours.Process.Kill(); ours.Wait() })
	// Started from a shell that exits at once: its parent is then init.
	out, err := exec.Command("bash", "-c", `(exec -a runc /bin/sh -c "sleep 600; :" x --root "$1") >/dev/null 2>&1 & echo $!`, "bash", root).Output()
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("orphan pid: %q", out)
	}
	t.Cleanup(func() { syscall.Kill(orphan, syscall.SIGKILL) })
	testutil.Eventually(t, 10*time.Second, "the orphan is seen as a stray and ours is not", func() error {
		got := r.stray()
		if !slices.Contains(got, orphan) || slices.Contains(got, ours.Process.Pid) {
			return fmt.Errorf("strays %v; the orphan is %d, ours %d", got, orphan, ours.Process.Pid)
		}
		return nil
	})
}
