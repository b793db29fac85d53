package container_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/testutil"
)

// testBackend makes a container backend over a test directory.
func testBackend(t *testing.T) (*container.Backend, string) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.Tool("mkfs.erofs"), testutil.File("/bin/busybox"))
	agentBin := filepath.Join(testutil.Binaries(t), "dsec-agent")
	root := t.TempDir()
	parent := "dsec-test-" + filepath.Base(filepath.Dir(root))
	b, err := container.New(container.Config{Root: root, AgentPath: agentBin, CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		testutil.UnmountAll(root)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+parent) {
			os.Remove(d)
		}
	})
	return b, root
}

func initPid(t *testing.T, root, id string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "runc", id, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pid int `json:"init_process_pid"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	return st.Pid
}

func sh(t *testing.T, b *container.Backend, id, cmd string) (string, int) {
	t.Helper()
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
	defer ag.Close()
	res, err := ag.Exec(context.Background(), &api.ExecRequest{Shell: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res.Stdout + res.Stderr, res.ExitCode
}

// TestResetInPlace checks what the behaviour suite cannot see: the fast
// reset keeps the container (same init) and gives it a new IPC namespace,
// commands never hold CAP_SYS_ADMIN nor escape the commands' seccomp
// filter, and a paused sandbox is reset by a restart instead.
func TestResetInPlace(t *testing.T) {
	b, root := testBackend(t)
	ctx := context.Background()
	base := backendtest.MinimalLayer(t, t.TempDir())
	id := "inplace-" + filepath.Base(root)
	sp := backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: api.Resources{CPU: 0.5, MemoryMB: 64, Pids: 128}, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), id) })

	confined := func(t *testing.T) {
		out, _ := sh(t, b, id, "grep -E '^(CapBnd|CapEff|Seccomp_filters)' /proc/self/status /proc/1/status")
		for _, want := range []string{
			"/proc/self/status:CapBnd:\t00000000a80405fb", "/proc/self/status:CapEff:\t00000000a80405fb",
			"/proc/self/status:Seccomp_filters:\t2",
			"/proc/1/status:CapBnd:\t00000000a82405fb", "/proc/1/status:Seccomp_filters:\t1",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("want %q in:\n%s", want, out)
			}
		}
		for _, cmd := range []string{
			"mount -t tmpfs none /mnt", "unshare -U true", "unshare -m true",
			"ls /proc/1/root/", "cat /proc/1/environ", "readlink /proc/1/fd/0", "cat /proc/1/mem", "kill -9 1",
		} {
			if out, code := sh(t, b, id, cmd); code == 0 {
				t.Errorf("%q succeeded in a sandbox: %s", cmd, out)
			}
		}
	}
	t.Run("commands are confined", confined)

	pid := initPid(t, root, id)
	ipc, _ := sh(t, b, id, "readlink /proc/self/ns/ipc")
	for i := range 2 {
		if err := b.Reset(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := initPid(t, root, id); got != pid {
			t.Fatalf("reset %d restarted the container (init %d, was %d)", i+1, got, pid)
		}
		now, _ := sh(t, b, id, "readlink /proc/self/ns/ipc")
		if now == ipc {
			t.Fatalf("reset %d kept the IPC namespace %s", i+1, now)
		}
		ipc = now
	}
	t.Run("commands are confined after resets", confined)

	t.Run("a paused sandbox is restarted", func(t *testing.T) {
		if err := b.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := b.Reset(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := initPid(t, root, id); got == pid {
			t.Fatal("the paused sandbox kept its init")
		}
		if out, code := sh(t, b, id, "echo ok"); code != 0 || out != "ok\n" {
			t.Fatalf("after the restart: %q %d", out, code)
		}
	})
}
