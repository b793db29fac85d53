package microvm_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/microvm"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/initramfs"
	"github.com/dsec-project/dsec/internal/testutil"
	"github.com/dsec-project/dsec/internal/vmlink"
)

// bootOne creates one sandbox on b and destroys it at the end.
func bootOne(t *testing.T, b *microvm.Backend, res api.Resources) (string, *agent.Client) {
	t.Helper()
	base := backendtest.MinimalLayer(t, t.TempDir())
	id := "vm-" + strconv.Itoa(os.Getpid()) + "-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	ctx := context.Background()
	if err := b.Create(ctx, backend.Spec{ID: id, Backend: b.Name(), Layers: []backend.Layer{base}, Resources: res}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Destroy(context.Background(), id); err != nil {
			t.Error(err)
		}
	})
	return id, agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
}

func execOK(t *testing.T, ag *agent.Client, shell string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := ag.Exec(ctx, &api.ExecRequest{Shell: shell})
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d: %s", shell, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

// waitFile waits until path exists in the guest: a command running in the
// background has started.
func waitFile(t *testing.T, ag *agent.Client, path string) {
	t.Helper()
	testutil.Eventually(t, time.Minute, path+" made", func() error {
		if out := execOK(t, ag, "test -e "+path+" && echo yes || echo no"); out != "yes" {
			return fmt.Errorf("no %s", path)
		}
		return nil
	})
}

// TestGuest checks that a sandbox is a VM of its own: its kernel, its
// vCPUs and memory, no network.
func TestGuest(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	k, err := initramfs.FindKernel(testutil.GuestKernelDir())
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	b := newBackend(t, root, vmlink.ClientConfig{})
	id, ag := bootOne(t, b, api.Resources{CPU: 1.5, MemoryMB: 192, DiskMB: 256})
	t.Run("the VMM's CPU time is capped at the CPU share", func(t *testing.T) {
		dirs := cgroupDirs(cgroupParent(root))
		if len(dirs) == 0 {
			t.Fatal("no cgroup parent")
		}
		var quota string
		for _, d := range dirs {
			if b, err := os.ReadFile(filepath.Join(d, id, "cpu.cfs_quota_us")); err == nil {
				quota = strings.TrimSpace(string(b))
			} else if b, err := os.ReadFile(filepath.Join(d, id, "cpu.max")); err == nil {
				quota, _, _ = strings.Cut(strings.TrimSpace(string(b)), " ")
			}
		}
		if quota != "150000" {
			t.Fatalf("cpu quota of the VM's cgroup: %q, want 150000", quota)
		}
	})
	var host syscall.Utsname
	syscall.Uname(&host)
	tests := []struct {
		name, shell string
		check       func(string) bool
	}{
		{"uname shows the guest kernel", "uname -r", func(s string) bool {
			return s == k.Version && s != utsString(host.Release)
		}},
		{"vCPUs round the CPU share up", "grep -c ^processor /proc/cpuinfo", func(s string) bool { return s == "2" }},
		{"memory is the guest's RAM", "awk '/MemTotal/ {print $2}' /proc/meminfo", func(s string) bool {
			kb, err := strconv.Atoi(s)
			return err == nil && kb > 100<<10 && kb <= 192<<10
		}},
		{"no network but loopback", "ls /sys/class/net", func(s string) bool { return s == "lo" }},
		{"writable disk of the asked size", "df -k / | awk 'NR==2 {print $2}'", func(s string) bool {
			kb, err := strconv.Atoi(s)
			return err == nil && kb > 200<<10 && kb <= 256<<10
		}},
		{"layer disks are read-only", "for d in /sys/block/vd*; do grep -q dsec-layer $d/serial && cat $d/ro; done", func(s string) bool { return s == "1" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if out := execOK(t, ag, tt.shell); !tt.check(out) {
				t.Fatalf("%s: got %q", tt.shell, out)
			}
		})
	}
}

func utsString(a [65]int8) string {
	var b []byte
	for _, c := range a {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// TestGuestFailures checks that a hung or panicked guest makes a failed
// sandbox, not a hung call.
func TestGuestFailures(t *testing.T) {
	testutil.Require(t, testutil.MicroVMRequirements...)
	root := t.TempDir()
	b := newBackend(t, root, vmlink.ClientConfig{KeepAlive: 500 * time.Millisecond, Timeout: 3 * time.Second})
	id, ag := bootOne(t, b, api.Resources{CPU: 1, MemoryMB: 256, DiskMB: 256})
	ctx := context.Background()
	pidData, err := os.ReadFile(filepath.Join(root, "vms", id, microvm.PidFile))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidData)))

	t.Run("a pause holds requests in flight", func(t *testing.T) {
		type result struct {
			res *api.ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := ag.Exec(ctx, &api.ExecRequest{Shell: "touch /tmp/pause-started; sleep 1; echo done"})
			done <- result{res, err}
		}()
		waitFile(t, ag, "/tmp/pause-started")
		if err := b.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		if st, err := b.State(ctx, id); err != nil || st != api.StatePaused {
			t.Fatalf("state: %q %v", st, err)
		}
		// sleep: a pause longer than the link's ping timeout is the case under test
		time.Sleep(5 * time.Second)
		if err := b.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil || r.res.Stdout != "done\n" {
			t.Fatalf("exec across a pause: %+v %v", r.res, r.err)
		}
	})

	t.Run("hang", func(t *testing.T) {
		errc := make(chan error, 1)
		go func() {
			_, err := ag.Exec(ctx, &api.ExecRequest{Shell: "touch /tmp/hang-started; sleep 600"})
			errc <- err
		}()
		waitFile(t, ag, "/tmp/hang-started")
		// A stopped VMM is a guest that answers nothing: the whole VM hangs.
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer syscall.Kill(pid, syscall.SIGCONT)
		select {
		case err := <-errc:
			if !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("exec in a hung guest: %v, want unavailable", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("exec in a hung guest did not return")
		}
		if st, err := b.State(ctx, id); err != nil || st != api.StateFailed {
			t.Fatalf("state of a hung guest: %q %v", st, err)
		}
		syscall.Kill(pid, syscall.SIGCONT)
		if st, err := b.State(ctx, id); err != nil || st != api.StateRunning {
			t.Fatalf("state after the guest came back: %q %v", st, err)
		}
	})

	t.Run("panic", func(t *testing.T) {
		actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		res, err := ag.Exec(actx, &api.ExecRequest{Shell: "echo c > /proc/sysrq-trigger"})
		if err == nil {
			t.Fatalf("exec that panics the guest kernel succeeded: %+v", res)
		}
		t.Logf("exec that panics the guest: %v", err)
		testutil.Eventually(t, 2*time.Minute, "failed after a guest panic", func() error {
			st, err := b.State(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if st != api.StateFailed {
				return fmt.Errorf("state %q", st)
			}
			return nil
		})
		if _, err := ag.Exec(actx, &api.ExecRequest{Shell: "true"}); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("exec in a dead guest: %v, want unavailable", err)
		}
	})
}
