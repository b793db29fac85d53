package fullvm_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/backend/microvm/qemu"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/initramfs"
	"github.com/dsec-project/dsec/internal/testutil"
	"github.com/dsec-project/dsec/internal/vmlink"
)

var (
	fullVMMOnce sync.Once
	fullVMM     *qemu.VMM
	fullVMMErr  error
)

// newFullBackend makes a fullvm backend over root (the microvm backend in
// its full-VM mode), tracked like newBackend's for leaks.
func newFullBackend(t *testing.T, root string) *microvm.Backend {
	t.Helper()
	testutil.Require(t, testutil.FullVMRequirements...)
	fullVMMOnce.Do(func() {
		probe := ""
		if k, err := initramfs.FindKernel(testutil.GuestKernelDir()); err == nil {
			probe = k.Image
		}
		fullVMM, fullVMMErr = qemu.New(context.Background(), qemu.Config{Kernel: probe, CacheDir: os.TempDir()})
	})
	if fullVMMErr != nil {
		t.Fatal(fullVMMErr)
	}
	b, err := microvm.New(microvm.Config{Root: root, VMM: fullVMM, FullVM: true, CgroupParent: cgroupParent(root),
		Link: vmlink.ClientConfig{}})
	if err != nil {
		t.Fatal(err)
	}
	liveMu.Lock()
	if prev := live[root]; prev != nil {
		prev.Close()
	}
	live[root] = b
	liveMu.Unlock()
	t.Cleanup(func() {
		b.Close()
		if leaks := microvm.Leaks(root); len(leaks) > 0 {
			t.Errorf("left behind: %v", leaks)
		}
		for _, d := range cgroupDirs(cgroupParent(root)) {
			entries, _ := os.ReadDir(d)
			for _, e := range entries {
				if e.IsDir() {
					t.Errorf("left behind: cgroup %s/%s", d, e.Name())
					syscall.Rmdir(filepath.Join(d, e.Name()))
				}
			}
			syscall.Rmdir(d)
		}
	})
	return b
}

var (
	// live is the backend of each root: a second backend on a root plays
	// the same node after an edge restart, so the first one dies first.
	liveMu sync.Mutex
	live   = map[string]*microvm.Backend{}
)

// cgroupParent is the tests' own cgroup parent for a backend root.
func cgroupParent(root string) string {
	return "dsec-fvmtest-" + filepath.Base(filepath.Dir(root)) + "-" + filepath.Base(root)
}

func cgroupDirs(parent string) []string {
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, r := range append(roots, "/sys/fs/cgroup") {
		if st, err := os.Stat(filepath.Join(r, parent)); err == nil && st.IsDir() {
			out = append(out, filepath.Join(r, parent))
		}
	}
	return out
}

// vmLayer is the vm image of `make vm-image`.
func vmLayer(t *testing.T) backend.Layer {
	return backend.Layer{Digest: "sha256:" + strings.Repeat("7", 64), Path: testutil.VMImagePath()}
}

// TestFullVMConformance runs the shared suite on full VMs booting the
// small Debian image (its own kernel and systemd), lean: a boot under TCG
// takes tens of seconds.
func TestFullVMConformance(t *testing.T) {
	testutil.Require(t, testutil.FullVMRequirements...)
	backendtest.Run(t, backendtest.Fixture{
		New:       func(t *testing.T, root string) backend.Backend { return newFullBackend(t, root) },
		Resources: api.Resources{CPU: 1, MemoryMB: 512, DiskMB: 2048},
		OwnKernel: true,
		Base:      vmLayer,
		WholeDisk: true,
		Lean:      true,
	})
}

// TestFullVMNotBootable: a layer that is not a bootable disk is refused
// as invalid input, leaving nothing behind.
func TestFullVMNotBootable(t *testing.T) {
	testutil.Require(t, testutil.FullVMRequirements...)
	ctx := context.Background()
	root := t.TempDir()
	b := newFullBackend(t, root)

	junk := t.TempDir() + "/junk.img"
	os.WriteFile(junk, []byte(strings.Repeat("not a disk", 1000)), 0o600)
	err := b.Create(ctx, backend.Spec{ID: "junk", Layers: []backend.Layer{{Digest: "sha256:" + strings.Repeat("1", 64), Path: junk}}})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("create from a file that is no disk: %v", err)
	}
	if leaks := microvm.Leaks(root); len(leaks) > 0 {
		t.Fatalf("after a refused create: %v", leaks)
	}
}

func agentOfFull(b backend.Backend, id string) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
}
