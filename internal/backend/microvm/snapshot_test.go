package microvm_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
	"github.com/dsec-project/dsec/internal/vmlink"
)

// TestSnapshot packs a running guest's writable layer: the host sees the
// guest's upper dir, whiteouts included, and the layers to flatten, while
// the guest is frozen; the guest goes on afterwards.
func TestSnapshot(t *testing.T) {
	testutil.Require(t, append(testutil.MicroVMRequirements, testutil.File("/dev/loop-control"))...)
	root := t.TempDir()
	b := newBackend(t, root, vmlink.ClientConfig{})
	id, ag := bootOne(t, b, api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 256})
	execOK(t, ag, "echo new > /new; rm /bin/ls; mkdir -p /work && echo w > /work/f")
	ctx := context.Background()
	for _, paused := range []bool{false, true} {
		name := "running"
		if paused {
			name = "paused"
			if err := b.Pause(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		t.Run(name, func(t *testing.T) {
			err := b.Snapshot(ctx, id, 1, func(ctx context.Context, dirs []string) error {
				if len(dirs) != 2 {
					t.Fatalf("dirs %v, want the upper dir and one layer", dirs)
				}
				upper := dirs[0]
				if b, err := os.ReadFile(filepath.Join(upper, "new")); err != nil || string(b) != "new\n" {
					t.Errorf("new file in the upper dir: %q %v", b, err)
				}
				if b, err := os.ReadFile(filepath.Join(upper, "work", "f")); err != nil || string(b) != "w\n" {
					t.Errorf("file in a new dir: %q %v", b, err)
				}
				var st syscall.Stat_t
				if err := syscall.Lstat(filepath.Join(upper, "bin", "ls"), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 0 {
					t.Errorf("the removed lower file is not a whiteout: mode %o rdev %d %v", st.Mode, st.Rdev, err)
				}
				if _, err := os.Stat(filepath.Join(dirs[1], "bin", "busybox")); err != nil {
					t.Errorf("the layer to flatten: %v", err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
		if paused {
			if st, _ := b.State(ctx, id); st != api.StatePaused {
				t.Fatalf("state after a snapshot of a paused sandbox: %q", st)
			}
			if err := b.Resume(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if out := execOK(t, ag, "echo after > /after; cat /after"); out != "after" {
			t.Fatalf("the guest after a snapshot: %q", out)
		}
	}
	if loops := loopsOf(root); len(loops) > 0 {
		t.Fatalf("loop devices left attached: %v", loops)
	}
}

// loopsOf lists loop devices whose backing file lies under root.
func loopsOf(root string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), root) {
			out = append(out, f)
		}
	}
	return out
}
