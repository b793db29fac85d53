package container

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/internal/testutil"
)

// TestSysvIPCGoesBack: sysvIPC reads another IPC namespace's objects from
// a thread that joins it, and every thread of the edge is back in the
// edge's own namespace afterwards (a thread left behind would give the
// edge a container's SysV objects).
func TestSysvIPCGoesBack(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("unshare"), testutil.Tool("ipcmk"))
	cmd := exec.Command("unshare", "--ipc", "sh", "-c", "ipcmk -M 4096 >/dev/null && echo made && exec sleep 600")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "made\n" {
		t.Fatalf("ipcmk in a new IPC namespace: %q %v", line, err)
	}
	host, err := os.Readlink("/proc/self/ns/ipc")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			b, err := sysvIPC(cmd.Process.Pid)
			if err == nil && strings.Count(string(b), "\n") != 4 { // three headers and the segment
				err = &unexpected{string(b)}
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile("/proc/sysvipc/shm"); err != nil || strings.Count(string(b), "\n") != 1 {
		t.Errorf("the test's own /proc/sysvipc/shm: %q %v", b, err)
	}
	// A thread might go back only after answering: look until the
	// deadline for every thread in the host's namespace.
	testutil.Eventually(t, 10*time.Second, "every thread back in the host's IPC namespace", func() error {
		tasks, err := filepath.Glob("/proc/self/task/*/ns/ipc")
		if err != nil {
			return err
		}
		for _, p := range tasks {
			if ns, err := os.Readlink(p); err == nil && ns != host {
				return &unexpected{p + " is in " + ns}
			}
		}
		return nil
	})
}

type unexpected struct{ s string }

func (u *unexpected) Error() string { return "unexpected: " + u.s }
