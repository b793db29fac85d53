package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend/container"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/testutil"
)

// edgeProc is a real `dsec edge` process: a node agent on its own, driven
// through the edge API as the control plane would.
type edgeProc struct {
	t      *testing.T
	args   []string
	data   string
	parent string // cgroup parent
	cmd    *exec.Cmd
	done   chan struct{}
	Client *edge.Client
	bin    string // the dsec binary; bin/dsec when empty
}

var edgeReadyRE = regexp.MustCompile(`msg="dsec edge ready" addr=(\S+)`)

func startEdge(t *testing.T, store string) *edgeProc {
	t.Helper()
	data := t.TempDir()
	e := &edgeProc{t: t, data: data, parent: "dsec-test-edge-" + filepath.Base(filepath.Dir(data))}
	e.args = []string{"edge", "--data", data, "--store", store, "--token", "edge-test-token",
		"--listen", "127.0.0.1:0", "--node-id", "edge-test", "--cgroup-parent", e.parent,
		"--agent", filepath.Join(testutil.Binaries(t), "dsec-agent")}
	t.Cleanup(e.cleanup)
	e.start()
	return e
}

func (e *edgeProc) start() {
	t := e.t
	t.Helper()
	bin := e.bin
	if bin == "" {
		bin = filepath.Join(testutil.Binaries(t), "dsec")
	}
	cmd := exec.Command(bin, e.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.cmd, e.done = cmd, make(chan struct{})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			if m := edgeReadyRE.FindStringSubmatch(sc.Text()); m != nil && !sent {
				addr <- m[1]
				sent = true
			}
		}
		if !sent {
			close(addr)
		}
		cmd.Wait()
		close(e.done)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("dsec edge exited before it was ready")
		}
		if e.Client, err = edge.NewClient("http://"+a, "edge-test-token"); err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("dsec edge not ready after a minute")
	}
}

// kill kills the edge with SIGKILL, as a crash would.
func (e *edgeProc) kill() {
	e.cmd.Process.Signal(syscall.SIGKILL)
	<-e.done
}

// waitNoLeaks waits until the edge's sandboxes have left nothing on the
// node (of what matches, if match is not nil) and fails the test if
// something stays: a destroyed sandbox's directory waits in the trash
// until the edge removes it in the background.
func (e *edgeProc) waitNoLeaks(t *testing.T, what string, match func(string) bool) {
	t.Helper()
	testutil.Eventually(t, time.Minute, "nothing left "+what, func() error {
		var left []string
		for _, l := range e.leaks() {
			if match == nil || match(l) {
				left = append(left, l)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left behind:\n  %s", strings.Join(left, "\n  "))
		}
		return nil
	})
}

// leaks lists what the edge's sandboxes left on the node.
// The blank sandboxes of its pool, its spare memory cgroups and its pin of
// the shared sysfs's namespace are the node's while it runs
// (testutil.WithoutBlanks, WithoutSpares, WithoutNodeMounts); once it has
// stopped they count.
func (e *edgeProc) leaks() (out []string) {
	defer func() {
		select {
		case <-e.done:
		default:
			out = testutil.WithoutNodeMounts(testutil.WithoutSpares(testutil.WithoutBlanks(out, filepath.Join(e.data, "container"))), filepath.Join(e.data, "container"))
		}
	}()
	entries, _ := os.ReadDir(filepath.Join(e.data, "container", "sandboxes"))
	for _, d := range entries {
		out = append(out, "directory "+d.Name())
	}
	// A destroyed sandbox's directory waits in the trash until the edge
	// removes it, in the background.
	trash, _ := os.ReadDir(filepath.Join(e.data, "container", "trash"))
	for _, d := range trash {
		out = append(out, "trash "+d.Name())
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	blobfsMount := filepath.Join(e.data, "blobfs", "mnt") // the node's, not a sandbox's
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], e.data+"/") && f[4] != blobfsMount {
			out = append(out, "mount "+f[4])
		}
	}
	runcOut, _ := exec.Command("runc", "--root", filepath.Join(e.data, "container", "runc"), "list", "-q").Output()
	for _, id := range strings.Fields(string(runcOut)) {
		out = append(out, "container "+id)
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + e.parent + "/*")
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, "cgroup "+d)
		}
	}
	return out
}

func (e *edgeProc) cleanup() {
	select {
	case <-e.done:
	default:
		e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(10 * time.Second):
			e.kill()
		}
	}
	runcRoot := filepath.Join(e.data, "container", "runc")
	out, _ := exec.Command("runc", "--root", runcRoot, "list", "-q").Output()
	for _, id := range strings.Fields(string(out)) {
		exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
	}
	testutil.UnmountAll(e.data)
	testutil.StopBlobfs(filepath.Join(e.data, "blobfs"))
	os.Remove(container.LockPath(e.parent)) // a killed edge leaves it
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + e.parent)
	for _, d := range append(dirs, "/sys/fs/cgroup/"+e.parent) {
		kids, _ := filepath.Glob(d + "/*")
		for _, k := range kids {
			syscall.Rmdir(k)
		}
		syscall.Rmdir(d)
	}
}

func edgeExec(t *testing.T, c *edge.Client, id string, req api.ExecRequest) *api.ExecResult {
	t.Helper()
	var res api.ExecResult
	if err := c.AgentJSON(ctxT(t), id, "POST", "/exec", nil, &req, &res); err != nil {
		t.Fatalf("exec in %s: %v", id, err)
	}
	return &res
}

// TestEdgeRestart kills a separate `dsec edge` process with SIGKILL while
// it runs sandboxes with background processes and while a create is in
// flight, and starts it again: the sandboxes are there, once each, with
// their files and running processes; the create in flight either finished
// (the sandbox works) or left nothing; destroying everything leaves
// nothing.
func TestEdgeRestart(t *testing.T) {
	s := startServer(t) // for its layer store, shared with the edge
	base, err := s.Client.GetLayer(ctxT(t), "base:minimal")
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, filepath.Join(s.DataDir, "store"))
	ctx := ctxT(t)
	create := func(id string) error {
		_, err := e.Client.Create(ctx, edge.CreateRequest{
			ID: id, Backend: api.BackendContainer, Layers: []string{base.Digest},
			Resources: api.Resources{CPU: 0.1, MemoryMB: 64, DiskMB: 64, Pids: 256}, Network: api.Network{Mode: api.NetworkNone},
		})
		return err
	}
	procs := map[string]string{}
	for i := range 3 {
		id := fmt.Sprintf("sb-edge%d", i)
		if err := create(id); err != nil {
			t.Fatal(err)
		}
		edgeExec(t, e.Client, id, api.ExecRequest{Shell: "echo " + id + " > /state"})
		procs[id] = edgeExec(t, e.Client, id, api.ExecRequest{
			Shell: "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done", Background: true,
		}).Process.ID
	}

	// A create in flight: kill the edge once it has begun on disk.
	const inflight = "sb-edgeinflight"
	go create(inflight)
	// Look often: the kill must come while the create is in flight.
	if err := testutil.PollEvery(time.Minute, time.Millisecond, func() error {
		_, err := os.Stat(filepath.Join(e.data, "container", "sandboxes", inflight))
		return err
	}); err != nil {
		t.Fatalf("the create never began: %v", err)
	}
	e.kill()
	e.start()

	list, err := e.Client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, st := range list {
		seen[st.ID]++
	}
	for id, pid := range procs {
		if seen[id] != 1 {
			t.Fatalf("after the restart %s is listed %d times: %+v", id, seen[id], list)
		}
		if out := edgeExec(t, e.Client, id, api.ExecRequest{Shell: "cat /state"}).Stdout; out != id+"\n" {
			t.Fatalf("%s lost its files: %q", id, out)
		}
		var p api.Process
		if err := e.Client.AgentJSON(ctx, id, "GET", "/procs/"+pid, nil, nil, &p); err != nil || !p.Running {
			t.Fatalf("%s: background process after the restart: %+v %v", id, p, err)
		}
		before := p.OutputSize
		testutil.Eventually(t, 30*time.Second, id+"'s output growing", func() error {
			if err := e.Client.AgentJSON(ctx, id, "GET", "/procs/"+pid, nil, nil, &p); err != nil {
				t.Fatal(err)
			}
			if p.OutputSize <= before {
				return fmt.Errorf("output stopped at %d bytes", before)
			}
			return nil
		})
	}
	switch seen[inflight] {
	case 1:
		t.Log("the create in flight had finished: it was adopted")
		edgeExec(t, e.Client, inflight, api.ExecRequest{Shell: "true"})
		procs[inflight] = ""
	case 0:
		t.Log("the create in flight had not finished: it was cleaned up")
		e.waitNoLeaks(t, "of the unfinished create", func(l string) bool { return strings.Contains(l, inflight) })
	}
	if len(list) != len(procs) {
		t.Fatalf("after the restart the edge lists %+v", list)
	}
	for id := range procs {
		if err := e.Client.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	e.waitNoLeaks(t, "of the sandboxes", nil)
}
