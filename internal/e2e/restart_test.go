package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
)

// TestServerRestart kills the all-in-one server with SIGKILL and starts it
// again: records and running sandboxes are still there and usable, with
// their files and their background processes, and nothing is duplicated.
func TestServerRestart(t *testing.T) {
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	tn, err := c.CreateTenant(ctx, "survivor")
	if err != nil {
		t.Fatal(err)
	}
	var boxes []*api.Sandbox
	var procs []string
	for i := range 3 {
		sb := newSandbox(t, c, nil)
		sh(t, c, sb.ID, "echo turn-"+string(rune('a'+i))+" > /state")
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done", Background: true})
		if err != nil {
			t.Fatal(err)
		}
		boxes, procs = append(boxes, sb), append(procs, res.Process.ID)
	}

	s.Kill()
	s.Restart()
	c = s.Client

	if _, err := c.ListTenants(ctx); err != nil {
		t.Fatalf("admin key after restart: %v", err)
	}
	if ts, _ := c.ListTenants(ctx); len(ts) != 2 || (ts[0].ID != tn.ID && ts[1].ID != tn.ID) {
		t.Fatalf("tenants after restart: %+v", ts)
	}
	list, err := c.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(list.Sandboxes) != len(boxes) {
		t.Fatalf("after restart %d sandboxes listed (%v), want %d", len(list.Sandboxes), err, len(boxes))
	}
	for i, sb := range boxes {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != api.StateRunning {
			t.Fatalf("sandbox %s after restart: %+v %v", sb.ID, got, err)
		}
		if out := sh(t, c, sb.ID, "cat /state"); out != "turn-"+string(rune('a'+i))+"\n" {
			t.Fatalf("state of %s after restart: %q", sb.ID, out)
		}
		p, err := c.GetProcess(ctx, sb.ID, procs[i])
		if err != nil || !p.Running {
			t.Fatalf("background process of %s after restart: %+v %v", sb.ID, p, err)
		}
		first, err := c.ReadOutput(ctx, sb.ID, procs[i], "stdout", 0)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		later, err := c.ReadOutput(ctx, sb.ID, procs[i], "stdout", 0)
		if err != nil || len(later.Data) <= len(first.Data) || !strings.HasPrefix(string(later.Data), "tick 1\n") {
			t.Fatalf("output of %s does not continue after restart: %q then %q", sb.ID, first.Data, later.Data)
		}
	}
	sb := newSandbox(t, c, nil) // new creates still work
	sh(t, c, sb.ID, "true")
}
