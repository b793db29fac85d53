package container_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/backend/backendtest"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestCPUQuotaIsTheCommands checks that a small CPU request throttles the
// sandbox's commands and not its agent: on cgroup v1 the commands (and
// what they fork) run in a child cpu cgroup with the quota, the agent in
// the sandbox's cgroup without one, also after a reset in place. On
// cgroup v2 the quota stays on the sandbox's cgroup, which holds both.
func TestCPUQuotaIsTheCommands(t *testing.T) {
	b, root, id, dir := createLimited(t, "cpu", api.Resources{CPU: 0.05, MemoryMB: 64, Pids: 64}, "cpu.max", "5000 100000")
	if dir == "" {
		return
	}
	ctx := context.Background()
	cmd := filepath.Join(dir, "cmd")
	if got := readTrim(t, filepath.Join(dir, "cpu.cfs_quota_us")); got != "-1" {
		t.Fatalf("the agent's cpu cgroup has quota %s", got)
	}
	if got := readTrim(t, filepath.Join(cmd, "cpu.cfs_quota_us")); got != "5000" {
		t.Fatalf("the commands' cpu cgroup has quota %s", got)
	}
	if got, err := os.ReadFile(filepath.Join(cmd, "cpu.cfs_burst_us")); err == nil && strings.TrimSpace(string(got)) != "5000" {
		t.Fatalf("the commands' cpu cgroup has a burst of %s, want one quota", got)
	}
	// The agent's weight is never below the kernel's default: at 51
	// (0.05 × 1024) it lost to any background work on the node.
	if got := readTrim(t, filepath.Join(dir, "cpu.shares")); got != "1024" {
		t.Fatalf("the agent's cpu cgroup has cpu.shares %s, want 1024", got)
	}

	placed := func(t *testing.T) {
		pid := initPid(t, root, id)
		if out, code := sh(t, b, id, "sleep 60 >/dev/null 2>&1 & sh -c 'sleep 61 >/dev/null 2>&1 &'"); code != 0 {
			t.Fatalf("start sleeps: %s", out)
		}
		defer sh(t, b, id, "pkill sleep")
		inCmd, inSandbox := tasks(t, cmd), tasks(t, dir)
		for _, name := range []string{"sleep 60", "sleep 61"} {
			p := findProc(t, inCmd, name)
			if p == 0 {
				t.Fatalf("%q (and what a command forks) is not in the commands' cpu cgroup %s", name, cmd)
			}
			if inSandbox[p] {
				t.Fatalf("%q is in the agent's cpu cgroup", name)
			}
		}
		// The agent's threads: the spawner (a thread locked to forking,
		// and the main thread stays wedged there if it was one) is in the
		// commands' cgroup; every thread that serves requests is not.
		threads, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			t.Fatal(err)
		}
		var spawners, serving int
		for _, th := range threads {
			tid, _ := strconv.Atoi(th.Name())
			switch {
			case inCmd[tid]:
				spawners++
			case inSandbox[tid]:
				serving++
			}
		}
		if spawners == 0 || spawners > 2 || serving == 0 {
			t.Fatalf("agent threads: %d in the commands' cgroup (want 1 or 2 spawners), %d in the sandbox's", spawners, serving)
		}
	}
	t.Run("commands run in the quota'd cgroup, the agent does not", placed)

	t.Run("warm execs are not throttled, a busy command is", func(t *testing.T) {
		before := throttled(t, dir)
		for range 30 {
			if out, code := sh(t, b, id, "true"); code != 0 {
				t.Fatalf("true: %d %s", code, out)
			}
		}
		if after := throttled(t, dir); after != before {
			t.Fatalf("the agent's cgroup was throttled %d times during warm execs", after-before)
		}
		cmdBefore := throttled(t, cmd)
		sh(t, b, id, "timeout 1 sh -c 'while :; do :; done'")
		if throttled(t, cmd) == cmdBefore {
			t.Fatal("a busy loop was never throttled: the command escaped its quota")
		}
	})

	if err := b.Reset(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Run("after a reset in place", placed)

	destroyLeavesNoCgroup(t, b, id, cmd, dir)
}

// createLimited creates a sandbox of res named after controller and
// returns its directory in controller's cgroup v1 hierarchy. On cgroup v2
// it checks that the sandbox's file v2File reads want and returns "".
func createLimited(t *testing.T, controller string, res api.Resources, v2File, want string) (*container.Backend, string, string, string) {
	t.Helper()
	b, root := testBackend(t)
	base := backendtest.MinimalLayer(t, t.TempDir())
	id := controller + "-" + filepath.Base(root)
	sp := backend.Spec{ID: id, Backend: api.BackendContainer, Layers: []backend.Layer{base},
		Resources: res, Network: api.Network{Mode: api.NetworkNone}}
	if err := b.Create(context.Background(), sp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), id) })
	paths := cgroupPaths(t, root, id)
	dir, v1 := paths[controller]
	if !v1 {
		if got := readTrim(t, filepath.Join(paths[""], v2File)); got != want {
			t.Fatalf("cgroup v2: %s of the sandbox: %q, want %q", v2File, got, want)
		}
		return b, root, id, ""
	}
	return b, root, id, dir
}

// destroyLeavesNoCgroup destroys sandbox id and checks that none of dirs
// is left.
func destroyLeavesNoCgroup(t *testing.T, b *container.Backend, id string, dirs ...string) {
	t.Helper()
	if err := b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left after destroy: %v", d, err)
		}
	}
}

func cgroupPaths(t *testing.T, root, id string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "runc", id, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Paths map[string]string `json:"cgroup_paths"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	return st.Paths
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// tasks is the set of thread ids in a cgroup v1 cgroup.
func tasks(t *testing.T, dir string) map[int]bool {
	out := map[int]bool{}
	for _, f := range strings.Fields(readTrim(t, filepath.Join(dir, "tasks"))) {
		n, _ := strconv.Atoi(f)
		out[n] = true
	}
	return out
}

// findProc returns the pid among ids whose command line is cmdline, polling
// briefly: a backgrounded command may not have exec'd yet.
func findProc(t *testing.T, ids map[int]bool, cmdline string) int {
	t.Helper()
	found := 0
	_ = testutil.Poll(10*time.Second, func() error {
		for id := range ids {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(id) + "/cmdline")
			if strings.Join(strings.Fields(strings.ReplaceAll(string(b), "\x00", " ")), " ") == cmdline {
				found = id
				return nil
			}
		}
		return fmt.Errorf("no process runs %q", cmdline)
	})
	return found
}

func throttled(t *testing.T, dir string) int {
	t.Helper()
	for _, line := range strings.Split(readTrim(t, filepath.Join(dir, "cpu.stat")), "\n") {
		if v, ok := strings.CutPrefix(line, "nr_throttled "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no nr_throttled in %s/cpu.stat", dir)
	return 0
}

// TestPidsReserve checks that a sandbox's commands cannot take the pids
// its agent needs: on cgroup v1 they run in a child pids cgroup with the
// tenant's limit, the sandbox's own has a reserve more. Commands that
// use up their limit leave the agent serving (a Go agent that cannot
// make a thread it needs aborts), and a reset brings the sandbox back.
func TestPidsReserve(t *testing.T) {
	const limit = 48
	// No CPU request: the pids cgroup alone is placed.
	b, _, id, dir := createLimited(t, "pids", api.Resources{MemoryMB: 64, Pids: limit}, "pids.max", strconv.Itoa(limit))
	if dir == "" {
		return
	}
	ctx := context.Background()
	cmd := filepath.Join(dir, "cmd")
	placed := func(t *testing.T) {
		if got := readTrim(t, filepath.Join(cmd, "pids.max")); got != strconv.Itoa(limit) {
			t.Fatalf("the commands' pids.max is %s, want %d", got, limit)
		}
		if got, want := readTrim(t, filepath.Join(dir, "pids.max")), strconv.Itoa(limit+container.AgentPidsReserve); got != want {
			t.Fatalf("the sandbox's pids.max is %s, want %s", got, want)
		}
		if out, code := sh(t, b, id, "sleep 60 >/dev/null 2>&1 &"); code != 0 {
			t.Fatalf("start a sleep: %s", out)
		}
		defer sh(t, b, id, "pkill sleep")
		if findProc(t, tasks(t, cmd), "sleep 60") == 0 {
			t.Fatal("a command's child is not in the commands' pids cgroup")
		}
	}
	t.Run("commands have the tenant's limit, the agent a reserve", placed)

	t.Run("commands that use their limit up leave the agent serving", func(t *testing.T) {
		// More sleeps than the limit allows (the shell gives up at its
		// first failed fork), then sleeps started by the agent itself
		// until the commands' cgroup is full.
		sh(t, b, id, fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 600 >/dev/null 2>&1 & i=$((i+1)); done 2>/dev/null", 2*limit))
		ag := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id) })
		defer ag.Close()
		testutil.EventuallyTrue(t, 30*time.Second, "the commands' cgroup full", func() bool {
			if _, err := ag.Exec(ctx, &api.ExecRequest{Cmd: []string{"sleep", "600"}, Background: true}); err != nil {
				t.Fatalf("the agent failed to answer: %v", err)
			}
			return readTrim(t, filepath.Join(cmd, "pids.current")) == strconv.Itoa(limit)
		})
		// The agent answers every request, and can still make threads:
		// a command cannot start (its fork fails) but is reported as
		// such.
		for range 5 {
			if out, code := sh(t, b, id, "true"); code == 0 {
				t.Fatalf("a command started in a full commands' cgroup: %s", out)
			}
		}
		if cur, max := readTrim(t, filepath.Join(dir, "pids.current")), limit+container.AgentPidsReserve; cur == strconv.Itoa(max) {
			t.Fatalf("the sandbox's cgroup is full (%s): the agent has no room left", cur)
		}
	})

	if err := b.Reset(ctx, id); err != nil {
		t.Fatal(err)
	}
	if out, code := sh(t, b, id, "true"); code != 0 {
		t.Fatalf("true after the reset: %d %s", code, out)
	}
	t.Run("after a reset in place", placed)

	destroyLeavesNoCgroup(t, b, id, cmd, dir)
}
