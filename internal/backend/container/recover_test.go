package container_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/mount"
	"github.com/dsec-project/dsec/internal/testutil"
)

func newBackend(t *testing.T, root, cgroupParent string) *container.Backend {
	t.Helper()
	b, err := container.New(container.Config{
		Root: root, AgentPath: filepath.Join(testutil.Binaries(t), "dsec-agent"), CgroupParent: cgroupParent,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A backend of a test is abandoned, not closed, to play an edge that
	// died (whose death releases its cgroup parent's lock); closing it at
	// the end removes the spare memory cgroups it kept, as the next start
	// would.
	container.PlayDead(b)
	t.Cleanup(func() {
		b.Close()
		os.Remove(container.LockPath(cgroupParent)) // a death leaves it
	})
	return b
}

// sandboxMounts lists the mounts under a backend's root but for the pin of
// its shared sysfs's network namespace, which stays as long as the backend
// does (TestSharedSysfs).
func sandboxMounts(root string) []mount.Info {
	ms, _ := mount.MountsUnder(root)
	return slices.DeleteFunc(ms, func(m mount.Info) bool { return m.Mountpoint == filepath.Join(root, testutil.SysfsPin) })
}

func execIn(t *testing.T, b backend.Backend, id string, req api.ExecRequest) *api.ExecResult {
	t.Helper()
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
	defer ag.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := ag.Exec(ctx, &req)
	if err != nil {
		t.Fatalf("exec in %s: %v", id, err)
	}
	return res
}

// TestRecoverRepairs breaks a node while its edge is down — a sandbox's
// agent socket deleted, another's init killed, the shared layer unmounted —
// and checks that the next edge repairs all of it: every sandbox comes back
// with its files, the healthy one with its background process still
// running, the layer mounted again, and destroying them leaves nothing.
func TestRecoverRepairs(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx := context.Background()
	root := t.TempDir()
	// The test's temporary directory has a random name: unique among the
	// tests of everyone on the machine.
	cgroupParent := "dsec-test-" + filepath.Base(filepath.Dir(root))
	t.Cleanup(func() {
		testutil.UnmountAll(root)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+cgroupParent) {
			os.Remove(d)
		}
	})
	base := backendtest.MinimalLayer(t, t.TempDir())
	b1 := newBackend(t, root, cgroupParent)
	ids := map[string]string{}
	for _, name := range []string{"healthy", "nosocket", "deadinit"} {
		id := "rep-" + name + "-" + filepath.Base(root)
		ids[name] = id
		sp := backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
			Resources: api.Resources{CPU: 0.5, MemoryMB: 64, Pids: 128}, Network: api.Network{Mode: api.NetworkNone}}
		if err := b1.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { exec.Command("runc", "--root", filepath.Join(root, "runc"), "delete", "--force", id).Run() })
		execIn(t, b1, id, api.ExecRequest{Shell: "echo " + name + " > /kept"})
	}
	proc := execIn(t, b1, ids["healthy"], api.ExecRequest{Shell: "sleep 1000", Background: true}).Process

	// Break things while no edge runs.
	if err := os.Remove(filepath.Join(root, "sandboxes", ids["nosocket"], "agent.sock")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("runc", "--root", filepath.Join(root, "runc"), "kill", ids["deadinit"], "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	layerDir := filepath.Join(root, "layers", strings.TrimPrefix(base.Digest, "sha256:"))
	if err := unix.Unmount(layerDir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the killed init gone", func() error {
		out, err := exec.Command("runc", "--root", filepath.Join(root, "runc"), "state", ids["deadinit"]).Output()
		var st struct{ Status string }
		if err == nil && json.Unmarshal(out, &st) == nil && st.Status == "running" {
			return errors.New("runc state: still running")
		}
		return nil
	})

	b2 := newBackend(t, root, cgroupParent)
	specs, err := b2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 3 {
		t.Fatalf("recovered %d sandboxes: %+v", len(specs), specs)
	}
	for name, id := range ids {
		if out := execIn(t, b2, id, api.ExecRequest{Shell: "cat /kept"}).Stdout; out != name+"\n" {
			t.Errorf("%s after recover: /kept = %q", name, out)
		}
	}
	ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b2.Dial(ctx, ids["healthy"]) })
	if ps := listProcs(t, ag); len(ps) != 1 || ps[0].ID != proc.ID || !ps[0].Running {
		t.Errorf("background process of the healthy sandbox after recover: %+v", ps)
	}
	if ok, err := mount.IsMountpoint(layerDir); err != nil || !ok {
		t.Errorf("layer not mounted again: %v %v", ok, err)
	}
	for _, id := range ids {
		if err := b2.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if ms := sandboxMounts(root); len(ms) != 0 {
		t.Errorf("mounts left: %+v", ms)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "sandboxes")); len(entries) != 0 {
		t.Errorf("sandbox directories left: %v", entries)
	}
}

func listProcs(t *testing.T, ag *agent.Client) []api.Process {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "/procs", nil)
	resp, err := ag.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l api.ProcessList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return l.Processes
}

// TestRecoverKilledAgent kills -9 a sandbox's agent, the container's init,
// while the edge runs: the next exec through the edge restarts the
// sandbox over its kept files and answers, and destroying it leaves
// nothing.
func TestRecoverKilledAgent(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"), testutil.Tool("mkfs.erofs"))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	root := t.TempDir()
	cgroupParent := "dsec-test-" + filepath.Base(filepath.Dir(root))
	t.Cleanup(func() {
		testutil.UnmountAll(root)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+cgroupParent) {
			os.Remove(d)
		}
	})
	base := backendtest.MinimalLayer(t, t.TempDir())
	b := newBackend(t, root, cgroupParent)
	id := "killed-" + filepath.Base(root)
	sp := backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: api.Resources{CPU: 0.5, MemoryMB: 64, Pids: 128}, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(ctx, sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("runc", "--root", filepath.Join(root, "runc"), "delete", "--force", id).Run() })
	execIn(t, b, id, api.ExecRequest{Shell: "echo kept > /kept"})
	// The edge recovers the sandbox, as after its restart.
	e, err := edge.New(ctx, edge.Config{NodeID: "n1", Backends: []backend.Backend{newBackend(t, root, cgroupParent)}, Capacity: api.Resources{CPU: 1, MemoryMB: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := e.Agent(id)
	if err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command("runc", "--root", filepath.Join(root, "runc"), "state", id).Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runc state: %v %s", err, out)
	}
	if err := unix.Kill(st.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ag.Close() // the idle connection to the dead agent

	var res *api.ExecResult
	testutil.Eventually(t, 30*time.Second, "exec answered after the agent was killed", func() error {
		res, err = ag.Exec(ctx, &api.ExecRequest{Shell: "cat /kept"})
		return err
	})
	if res.Stdout != "kept\n" {
		t.Errorf("after repair: /kept = %q", res.Stdout)
	}
	if err := e.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ms := sandboxMounts(root); len(ms) != 0 {
		t.Errorf("mounts left: %+v", ms)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "sandboxes")); len(entries) != 0 {
		t.Errorf("sandbox directories left: %v", entries)
	}
}

// TestCgroupParentIsLocked checks that two backends on one host cannot
// share a cgroup parent (each would sweep the other's cgroups as
// leftovers at start) and that the parent is free again once the first
// closes.
func TestCgroupParentIsLocked(t *testing.T) {
	testutil.Require(t, testutil.Root, testutil.Tool("runc"), testutil.File("/bin/busybox"))
	agentBin := filepath.Join(testutil.Binaries(t), "dsec-agent")
	first, second := t.TempDir(), t.TempDir()
	parent := "dsec-test-" + filepath.Base(filepath.Dir(first))
	t.Cleanup(func() {
		testutil.UnmountAll(first)
		testutil.UnmountAll(second)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+parent) {
			os.Remove(d)
		}
	})
	a, err := container.New(container.Config{Root: first, AgentPath: agentBin, CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	_, err = container.New(container.Config{Root: second, AgentPath: agentBin, CgroupParent: parent})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), first) {
		a.Close()
		t.Fatalf("a second backend on the parent: %v; want ErrFailedPrecondition naming %s", err, first)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := container.New(container.Config{Root: second, AgentPath: agentBin, CgroupParent: parent})
	if err != nil {
		t.Fatalf("the parent after the first closed: %v", err)
	}
	b.Close()
	if _, err := os.Stat(container.LockPath(parent)); !os.IsNotExist(err) {
		t.Errorf("the lock file is left after Close: %v", err)
	}
}
