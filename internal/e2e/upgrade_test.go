package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
)

// TestEdgeUpgradeInPlace: an edge replaced by a second build of the tree
// (another build id: a different binary) while 20 sandboxes run takes
// them all over: listed once, files kept, background processes running.
// A data directory stamped by a newer dsec is refused clearly.
func TestEdgeUpgradeInPlace(t *testing.T) {
	s := startServer(t)
	base, err := s.Client.GetLayer(ctxT(t), "base:minimal")
	if err != nil {
		t.Fatal(err)
	}
	// The second build, before the sandboxes exist (bounded).
	newer := filepath.Join(t.TempDir(), "dsec")
	bctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	build := exec.CommandContext(bctx, "go", "build", "-ldflags=-buildid=dsec-upgrade-test", "-o", newer, "../../cmd/dsec")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("second build: %v\n%s", err, out)
	}

	e := startEdge(t, filepath.Join(s.DataDir, "store"))
	ctx := ctxT(t)
	const n = 20
	procs := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("sb-upg%d", i)
		if _, err := e.Client.Create(ctx, edge.CreateRequest{
			ID: id, Backend: api.BackendContainer, Layers: []string{base.Digest},
			Resources: api.Resources{CPU: 0.1, MemoryMB: 64, DiskMB: 64, Pids: 256}, Network: api.Network{Mode: api.NetworkNone},
		}); err != nil {
			t.Fatal(err)
		}
		edgeExec(t, e.Client, id, api.ExecRequest{Shell: "echo " + id + " > /state"})
		procs[id] = edgeExec(t, e.Client, id, api.ExecRequest{
			Shell: "while true; do echo tick; sleep 0.2; done", Background: true,
		}).Process.ID
	}

	// Replace in place: stop the old edge as a service manager would
	// (SIGTERM), start the new binary on the same data.
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(time.Minute):
		t.Fatal("old edge did not stop")
	}
	e.bin = newer
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
			t.Fatalf("after the upgrade %s is listed %d times", id, seen[id])
		}
		if out := edgeExec(t, e.Client, id, api.ExecRequest{Shell: "cat /state"}).Stdout; out != id+"\n" {
			t.Fatalf("%s lost its files: %q", id, out)
		}
		var p api.Process
		if err := e.Client.AgentJSON(ctx, id, "GET", "/procs/"+pid, nil, nil, &p); err != nil || !p.Running {
			t.Fatalf("%s: background process after the upgrade: %+v %v", id, p, err)
		}
	}

	// A downgrade under a newer layout is refused, clearly.
	e.kill()
	os.WriteFile(filepath.Join(e.data, "state-version.json"), []byte(`{"version":99}`), 0o600)
	out, _ := exec.CommandContext(ctx, newer, e.args...).CombinedOutput()
	if !strings.Contains(string(out), "newer than this binary") {
		t.Fatalf("edge on a newer data directory: %s", out)
	}
	os.WriteFile(filepath.Join(e.data, "state-version.json"), []byte(`{"version":1}`), 0o600)
	e.start() // for the cleanup, which deletes the sandboxes
	for id := range procs {
		if err := e.Client.Destroy(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	e.waitNoLeaks(t, "on the node after deleting all", nil)
}
