package e2e

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// tenantClient makes a tenant and a key for it.
func tenantClient(t *testing.T, s *testutil.Server, name string) (*client.Client, string) {
	t.Helper()
	tn, err := s.Client.CreateTenant(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.Client.CreateKey(ctxT(t), tn.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	return client.New(s.URL, k.Secret), tn.ID
}

// runcContainers lists the containers runc runs for the server's
// sandboxes: not the blank sandboxes of its node's pool.
func runcContainers(t *testing.T, s *testutil.Server) []string {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(s.DataDir, "edge", "container", "runc"), "list", "-q").Output()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, id := range strings.Fields(string(out)) {
		if !strings.HasPrefix(id, testutil.BlankPrefix) {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestServerRestart kills the all-in-one server with SIGKILL while twenty
// sandboxes run background processes, and starts it again: every sandbox
// is still there, once, with its files; its process kept running through
// the restart; and another client of the tenant, with another key,
// reattaches to the process by id and reads its output as it continues.
func TestServerRestart(t *testing.T) {
	s := startServer(t)
	c, tenant := tenantClient(t, s, "survivor")
	const n = 20
	boxes := make([]*api.Sandbox, n)
	procs := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{
				Layers: &api.LayerRefs{Base: "base:minimal"}, Resources: api.Resources{MemoryMB: 64, CPU: 0.1},
			})
			if err != nil {
				errs <- err
				return
			}
			boxes[i] = sb
			if _, err := c.Exec(ctxT(t), sb.ID, &api.ExecRequest{Shell: fmt.Sprintf("echo box-%d > /state", i)}); err != nil {
				errs <- err
				return
			}
			res, err := c.Exec(ctxT(t), sb.ID, &api.ExecRequest{
				Shell: "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done", Background: true,
			})
			if err != nil {
				errs <- err
				return
			}
			procs[i] = res.Process.ID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	s.Kill()
	s.Restart()

	// Another client of the same tenant, with a key of its own.
	k, err := s.Client.CreateKey(ctxT(t), tenant, false)
	if err != nil {
		t.Fatal(err)
	}
	c2 := client.New(s.URL, k.Secret)
	ctx := ctxT(t)
	list, err := c2.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(list.Sandboxes) != n {
		t.Fatalf("after restart %d sandboxes listed (%v), want %d", len(list.Sandboxes), err, n)
	}
	if got := runcContainers(t, s); len(got) != n {
		t.Fatalf("after restart runc runs %d containers, want %d: %v", len(got), n, got)
	}
	for i, sb := range boxes {
		got, err := c2.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != api.StateRunning {
			t.Fatalf("sandbox %s after restart: %+v %v", sb.ID, got, err)
		}
		if out := sh(t, c2, sb.ID, "cat /state"); out != fmt.Sprintf("box-%d\n", i) {
			t.Fatalf("state of %s after restart: %q", sb.ID, out)
		}
		p, err := c2.GetProcess(ctx, sb.ID, procs[i])
		if err != nil || !p.Running {
			t.Fatalf("background process of %s after restart: %+v %v", sb.ID, p, err)
		}
		first, err := c2.ReadOutput(ctx, sb.ID, procs[i], "stdout", 0)
		if err != nil || !strings.HasPrefix(string(first.Data), "tick 1\n") {
			t.Fatalf("output of %s after restart: %q %v", sb.ID, first.Data, err)
		}
		// Reattached: read on from where the output was, until it grows.
		testutil.Eventually(t, 30*time.Second, "the output of "+sb.ID+" continuing after restart", func() error {
			more, err := c2.ReadOutput(ctx, sb.ID, procs[i], "stdout", first.Next)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(more.Data), "tick ") || more.Offset != first.Next {
				return fmt.Errorf("at %d: %q from %d", first.Next, more.Data, more.Offset)
			}
			return nil
		})
	}
	sb := newSandbox(t, s.Client, nil) // new creates still work
	sh(t, s.Client, sb.ID, "true")
}

// TestServerCrashDuringCreates kills the server while creates are in
// flight: once some are done and others still creating. After the restart
// each of them either completed (the record is running and the sandbox
// answers) or was cleaned up (the record failed and nothing of it is left
// on the node); no container runs without a live record; deleting the
// survivors leaves nothing behind.
func TestServerCrashDuringCreates(t *testing.T) {
	s := startServer(t)
	c, _ := tenantClient(t, s, "inflight")
	const n = 8
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.CreateSandbox(ctxT(t), &api.CreateSandboxRequest{ // dies with the server
				Layers: &api.LayerRefs{Base: "base:minimal"}, Resources: api.Resources{MemoryMB: 64, CPU: 0.1},
			})
		}()
	}
	// Look often: some creates done and others in flight lasts only a while.
	if err := testutil.PollEvery(time.Minute, 2*time.Millisecond, func() error {
		states := map[string]int{}
		if l, err := c.ListSandboxes(ctxT(t), client.ListOptions{All: true}); err == nil {
			for _, sb := range l.Sandboxes {
				states[sb.State]++
			}
		}
		if states[api.StateRunning] > 0 && states[api.StateCreating] > 0 || states[api.StateRunning] == n {
			t.Logf("killing the server with %v", states)
			return nil
		}
		return fmt.Errorf("%v", states)
	}); err != nil {
		t.Fatalf("creates did not progress: %v", err)
	}
	s.Kill()
	wg.Wait()
	s.Restart()

	ctx := ctxT(t)
	all, err := c.ListSandboxes(ctx, client.ListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, sb := range all.Sandboxes {
		switch sb.State {
		case api.StateRunning:
			live[sb.ID] = true
			sh(t, c, sb.ID, "true")
		case api.StateFailed:
		default:
			t.Errorf("sandbox %s is %s after the restart, want running or failed", sb.ID, sb.State)
		}
	}
	containers := runcContainers(t, s)
	if len(containers) != len(live) {
		t.Errorf("runc runs %v, live records %v", containers, live)
	}
	for _, id := range containers {
		if !live[id] {
			t.Errorf("container %s runs without a live record", id)
		}
	}
	t.Logf("after the restart: %d of %d creates recorded, %d running", len(all.Sandboxes), n, len(live))
	for id := range live {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	testutil.RequireNoSandboxLeft(t, s)
}

// TestServerRestartRepairs breaks sandboxes while the server is down — one
// paused and then its init killed (as a host reboot would), one whose init
// is killed, one whose agent socket is deleted — and checks that after the
// restart all three run again with their files, and their records say so.
func TestServerRestartRepairs(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	boxes := map[string]*api.Sandbox{}
	for _, name := range []string{"paused", "deadinit", "nosocket"} {
		sb := newSandbox(t, c, nil)
		sh(t, c, sb.ID, "echo "+name+" > /kept")
		boxes[name] = sb
	}
	if _, err := c.Pause(ctx, boxes["paused"].ID); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	runcRoot := filepath.Join(s.DataDir, "edge", "container", "runc")
	for _, name := range []string{"paused", "deadinit"} {
		if out, err := exec.Command("runc", "--root", runcRoot, "kill", boxes[name].ID, "KILL").CombinedOutput(); err != nil {
			t.Fatalf("runc kill: %v %s", err, out)
		}
	}
	if err := os.Remove(filepath.Join(s.DataDir, "edge", "container", "sandboxes", boxes["nosocket"].ID, "agent.sock")); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	c = s.Client
	for name, sb := range boxes {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != api.StateRunning {
			t.Fatalf("%s after the restart: %+v %v", name, got, err)
		}
		if out := sh(t, c, sb.ID, "cat /kept"); out != name+"\n" {
			t.Fatalf("%s lost its files: %q", name, out)
		}
	}
	if got := runcContainers(t, s); len(got) != len(boxes) {
		t.Fatalf("runc runs %v", got)
	}
}

// TestRestartOnDemandLayers: with layer data read on demand, a sandbox
// survives `kill -9` of the server, and reads data it had never touched
// afterwards: the node's blobfs is a process of its own, and the new
// server finds it again instead of starting a second one.
func TestRestartOnDemandLayers(t *testing.T) {
	s := startServer(t, "--layer-direct-below", "0")
	c := s.Client
	ctx := ctxT(t)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB, several chunks
	if _, err := c.CreateLayer(ctx, api.KindWorkspace, "lazy:1", makeTar(t,
		tarFile{name: "data/first", body: "first"},
		tarFile{name: "data/later", body: big},
	), false); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, c, &api.LayerRefs{Base: "base:minimal", Workspace: "lazy:1"})
	if got := sh(t, c, sb.ID, "cat /data/first"); got != "first" {
		t.Fatalf("before restart: %q", got)
	}
	pid, err := os.ReadFile(filepath.Join(s.DataDir, "edge", "blobfs", "blobfs.pid"))
	if err != nil {
		t.Fatal(err)
	}

	s.Kill()
	s.Restart()
	c = s.Client

	if got := sh(t, c, sb.ID, "md5sum < /data/later"); got != md5hex(big)+"  -\n" {
		t.Fatalf("after restart, /data/later hashes to %q", got)
	}
	again, err := os.ReadFile(filepath.Join(s.DataDir, "edge", "blobfs", "blobfs.pid"))
	if err != nil || string(again) != string(pid) {
		t.Fatalf("blobfs pid %q before the restart, %q (%v) after: want the same process", pid, again, err)
	}
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestStopLeavesBlobfsOnlyInUse: a server stopped while a sandbox reads
// through the node's blobfs leaves it serving (the sandbox carries on
// across the restart); stopped with no sandbox left, it leaves no FUSE
// process and no mount behind.
func TestStopLeavesBlobfsOnlyInUse(t *testing.T) {
	s := startServer(t, "--layer-direct-below", "0")
	c := s.Client
	ctx := ctxT(t)
	big := strings.Repeat("fedcba9876543210", 1<<16)
	if _, err := c.CreateLayer(ctx, api.KindWorkspace, "lazy:1", makeTar(t, tarFile{name: "data/big", body: big}), false); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, c, &api.LayerRefs{Base: "base:minimal", Workspace: "lazy:1"})
	bfs := filepath.Join(s.DataDir, "edge", "blobfs")
	pid, err := os.ReadFile(filepath.Join(bfs, "blobfs.pid"))
	if err != nil {
		t.Fatal(err)
	}

	s.Stop()
	if again, err := os.ReadFile(filepath.Join(bfs, "blobfs.pid")); err != nil || string(again) != string(pid) {
		t.Fatalf("after a stop with a sandbox on it: blobfs pid %q (%v), want %q still serving", again, err, pid)
	}
	s.Restart()
	c = s.Client
	if got := sh(t, c, sb.ID, "md5sum < /data/big"); got != md5hex(big)+"  -\n" {
		t.Fatalf("after the restart, /data/big hashes to %q", got)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	s.Stop()
	n, _ := strconv.Atoi(strings.TrimSpace(string(pid)))
	if _, err := os.Stat(filepath.Join(bfs, "blobfs.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("blobfs pid file after a stop with no sandbox: %v", err)
	}
	if n > 0 && syscall.Kill(n, 0) == nil {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n)); strings.Contains(string(cmd), "blobfs") {
			t.Errorf("blobfs process %d still runs after a stop with no sandbox", n)
		}
	}
	if mounts, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(mounts), s.DataDir+"/") {
		t.Errorf("mounts left under the data dir:\n%s", mounts)
	}
}

// TestBlobfsKeeperKilled: kill -9 of the node's blobfs keeper (the process
// holding the FUSE mount) under a running sandbox whose layer is read on
// demand. Its worker serves on; the edge starts a keeper that adopts the
// worker's connection, so the sandbox reads data it had never touched, and
// a new sandbox on another lazily read layer is created and reads it.
func TestBlobfsKeeperKilled(t *testing.T) {
	s := startServer(t, "--layer-direct-below", "0")
	c := s.Client
	ctx := ctxT(t)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB, several chunks
	if _, err := c.CreateLayer(ctx, api.KindWorkspace, "lazy:1", makeTar(t,
		tarFile{name: "data/first", body: "first"},
		tarFile{name: "data/later", body: big},
	), false); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, c, &api.LayerRefs{Base: "base:minimal", Workspace: "lazy:1"})
	if got := sh(t, c, sb.ID, "cat /data/first"); got != "first" {
		t.Fatalf("before the kill: %q", got)
	}
	pidFile := filepath.Join(s.DataDir, "edge", "blobfs", "blobfs.pid")
	readPid := func() int {
		b, _ := os.ReadFile(pidFile)
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	old := readPid()
	if old == 0 {
		t.Fatal("no blobfs keeper pid")
	}
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, 30*time.Second, "a new blobfs keeper", func() bool {
		n := readPid()
		return n != 0 && n != old && syscall.Kill(n, 0) == nil
	})

	if got := sh(t, c, sb.ID, "md5sum < /data/later"); got != md5hex(big)+"  -\n" {
		t.Fatalf("after the keeper's kill, /data/later hashes to %q", got)
	}
	other := strings.Repeat("fedcba9876543210", 1<<16)
	if _, err := c.CreateLayer(ctx, api.KindWorkspace, "lazy:2", makeTar(t, tarFile{name: "data/other", body: other}), false); err != nil {
		t.Fatal(err)
	}
	sb2 := newSandbox(t, c, &api.LayerRefs{Base: "base:minimal", Workspace: "lazy:2"})
	if got := sh(t, c, sb2.ID, "md5sum < /data/other"); got != md5hex(other)+"  -\n" {
		t.Fatalf("a new sandbox after the keeper's kill: /data/other hashes to %q", got)
	}
}
