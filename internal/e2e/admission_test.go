package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestBusyNodeQueuesCreates is issue 12's RL failure: CPU-bound sandboxes
// keep the node busy, and more creates arrive. They must wait in the
// admission queue and run once the load falls, never fail with 429.
//
// The node offers a fifth of a core (--cpu 0.2), so that 8 sandboxes
// spinning keep it over the 90% threshold on a machine of any size, and
// however busy its other tenants keep it.
func TestBusyNodeQueuesCreates(t *testing.T) {
	s := startServer(t, "--cpu", "0.2", "--heartbeat", "500ms")
	c := s.Client
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The spinners: made idle first (a create while they spin would wait
	// too), then set spinning until /tmp/stop appears.
	spin := &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"},
		Resources: api.Resources{CPU: 1, MemoryMB: 32, DiskMB: 64}}
	var spinners []string
	for range 8 {
		sb, err := c.CreateSandbox(ctx, spin)
		if err != nil {
			t.Fatalf("create a spinner: %v", err)
		}
		spinners = append(spinners, sb.ID)
	}
	for _, id := range spinners {
		if _, err := c.Exec(ctx, id, &api.ExecRequest{Background: true,
			Shell: "while [ ! -e /tmp/stop ]; do :; done"}); err != nil {
			t.Fatal(err)
		}
	}
	waitNodes(t, c, "the node to report busy", func(nl *api.NodeList) bool { return nl.Nodes[0].Busy })
	start := time.Now()

	const more = 50
	small := &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"},
		Resources: api.Resources{CPU: 0.02, MemoryMB: 32, DiskMB: 64}}
	ids := make([]string, more)
	errs := make([]error, more)
	var wg sync.WaitGroup
	for i := range more {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(ctx, small)
			if err == nil {
				ids[i] = sb.ID
			}
			errs[i] = err
		}()
	}
	waitNodes(t, c, "50 creates to wait", func(nl *api.NodeList) bool { return nl.Admission.Waiting == more })
	t.Logf("%d creates waiting after %v", more, time.Since(start).Round(time.Millisecond))

	// The test suites end: the load falls and the waiting creates run.
	for _, id := range spinners {
		sh(t, c, id, "touch /tmp/stop")
	}
	start = time.Now()
	wg.Wait()
	t.Logf("all %d created %v after the load fell", more, time.Since(start).Round(time.Millisecond))
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d of %d failed (none may): %v", i, more, err)
		}
	}
	for _, id := range ids {
		if got := sh(t, c, id, "echo ok"); got != "ok\n" {
			t.Fatalf("sandbox %s answered %q", id, got)
		}
	}
	nl, err := c.NodeList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The spinners' own creates may have waited too (the node can turn
	// busy before the last of them), so at least the 50 were admitted.
	if a := nl.Admission; a.Waiting != 0 || a.Admitted < more || a.TimedOut != 0 {
		t.Fatalf("admission after the load fell: %+v; want all %d admitted", a, more)
	}
}

// waitNodes polls GET /v1/nodes until cond holds.
func waitNodes(t *testing.T, c *client.Client, what string, cond func(*api.NodeList) bool) {
	t.Helper()
	testutil.Eventually(t, 2*time.Minute, what, func() error {
		nl, err := c.NodeList(ctxT(t))
		if err != nil {
			return err
		}
		if len(nl.Nodes) > 0 && nl.Admission != nil && cond(nl) {
			return nil
		}
		return fmt.Errorf("nodes: %+v", nl)
	})
}
