package microvm_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/backend/microvm/qemu"
	"github.com/dsec-project/dsec/internal/initramfs"
	"github.com/dsec-project/dsec/internal/testutil"
	"github.com/dsec-project/dsec/internal/vmlink"
)

var (
	// live is the backend of each root: a second backend on a root plays
	// the same node after an edge restart, so the first one dies first.
	liveMu sync.Mutex
	live   = map[string]*microvm.Backend{}

	vmmOnce sync.Once
	vmm     *qemu.VMM
	vmmErr  error
)

// newBackend makes a microvm backend over root; the VMM (and its KVM
// probe) is shared by the whole test binary.
func newBackend(t *testing.T, root string, link vmlink.ClientConfig) *microvm.Backend {
	t.Helper()
	testutil.Require(t, testutil.MicroVMRequirements...)
	k, err := initramfs.FindKernel(testutil.GuestKernelDir())
	if err != nil {
		t.Fatal(err)
	}
	vmmOnce.Do(func() {
		vmm, vmmErr = qemu.New(context.Background(), qemu.Config{Kernel: k.Image, CacheDir: os.TempDir()})
	})
	if vmmErr != nil {
		t.Fatal(vmmErr)
	}
	b, err := microvm.New(microvm.Config{
		Root: root, VMM: vmm, Kernel: k, AgentPath: filepath.Join(testutil.Binaries(t), "dsec-agent"), Link: link,
		CgroupParent: cgroupParent(root),
	})
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
		// The parent is left for the hierarchy's owner; a sandbox's cgroup
		// left in it is a leak.
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

// cgroupParent is the tests' own cgroup parent for a backend root.
func cgroupParent(root string) string {
	return "dsec-vmtest-" + filepath.Base(filepath.Dir(root)) + "-" + filepath.Base(root)
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

func TestConformance(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	backendtest.Run(t, backendtest.Fixture{
		New: func(t *testing.T, root string) backend.Backend {
			return newBackend(t, root, vmlink.ClientConfig{})
		},
		Resources: api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 512},
		OwnKernel: true,
	})
}

// TestRecoverUnfinishedCreate plays an edge killed while a VM boots: the
// next edge finds the directory without vm.json and removes it, killing
// the VMM its pid file names.
func TestRecoverUnfinishedCreate(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	root := t.TempDir()
	b1 := newBackend(t, root, vmlink.ClientConfig{})
	base := backendtest.MinimalLayer(t, t.TempDir())
	id := "unfinished-" + strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	created := make(chan error, 1)
	go func() {
		created <- b1.Create(ctx, backend.Spec{ID: id, Layers: []backend.Layer{base}, Resources: api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 256}})
	}()
	pidFile := filepath.Join(root, "vms", id, microvm.PidFile)
	testutil.Eventually(t, time.Minute, "the VMM started", func() error {
		_, err := os.Stat(pidFile)
		return err
	})
	b2 := newBackend(t, root, vmlink.ClientConfig{}) // the edge after a restart
	specs, err := b2.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 0 {
		t.Fatalf("recovered an unfinished create: %+v", specs)
	}
	if leaks := microvm.Leaks(root); len(leaks) > 0 {
		t.Fatalf("after recovery: %v", leaks)
	}
	if err := <-created; err == nil { // the dead edge's create, for the record
		t.Fatal("the interrupted create succeeded")
	}
}
