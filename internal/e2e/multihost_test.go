package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestMultiHost runs a control plane on the host and three edges, each in
// its own network namespace behind a veth on a bridge (three machines on
// one LAN), joined over HTTP with a cluster token. Sandboxes spread over
// the three; one edge is killed; its sandboxes are reported lost, new ones
// go to the other two, and no call hangs.
func TestMultiHost(t *testing.T) {
	testutil.Short(t)
	testutil.Require(t, append(testutil.ServerRequirements, testutil.Tool("ip"), testutil.Tool("nsenter"))...)
	l := newLAN(t)
	hosts := []host{l.addHost(t, 0), l.addHost(t, 1), l.addHost(t, 2)}
	token := "cluster-" + l.suffix
	srv := testutil.StartServer(t, "--local-edge=false", "--listen", l.prefix+"1:0",
		"--cluster-token", token, "--node-timeout", "3s")
	var edges []*joinedEdge
	for i, h := range hosts {
		edges = append(edges, startJoinedEdge(t, h, fmt.Sprintf("edge-%d", i), srv.URL, token, filepath.Join(srv.DataDir, "store")))
	}
	c := srv.Client
	// Registered last, so it runs first: no sandbox outlives the test.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		page, _ := c.ListSandboxes(ctx, client.ListOptions{Limit: 1000})
		if page != nil {
			for _, sb := range page.Sandboxes {
				c.DeleteSandbox(ctx, sb.ID)
			}
		}
	})

	waitUntil(t, 30*time.Second, "three edges to join", func(ctx context.Context) bool {
		ns, err := c.ListNodes(ctx)
		up := 0
		for _, n := range ns {
			if n.State == api.NodeUp {
				up++
			}
		}
		return err == nil && up == 3
	})
	ns, _ := c.ListNodes(context.Background())
	// The three "hosts" share one machine: each offers 64 cores so that the
	// machine's CPU, which all three measure, weighs little against what
	// is allocated on each (their load is real, but the same load).
	for _, n := range ns {
		if !strings.HasPrefix(n.Addr, "http://"+l.prefix) || n.Capacity.MemoryMB != 6144 {
			t.Fatalf("node %s joined as %+v", n.ID, n)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// 1024 MB of 6144 each, a sixth of a node: the bonus of a node that
	// already caches the base layer (0.3 of a node) is worth under two
	// sandboxes, so the third node gets at least two of nine whenever the
	// cache reports arrive; after the loss the two others have room for
	// exactly six more.
	req := &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"}, Resources: api.Resources{CPU: 0.5, MemoryMB: 1024}}
	byNode := map[string][]string{}
	for range 9 {
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		byNode[sb.Node] = append(byNode[sb.Node], sb.ID)
		res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "echo hi from $(hostname)"})
		if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "hi from") {
			t.Fatalf("exec on %s (node %s): %+v, %v", sb.ID, sb.Node, res, err)
		}
	}
	for _, e := range edges {
		if len(byNode[e.id]) < 2 {
			t.Fatalf("sandboxes not spread over the three edges: %v", byNode)
		}
	}

	victim := edges[0]
	victim.kill()
	lostIDs := byNode[victim.id]
	waitUntil(t, 30*time.Second, "the killed edge's sandboxes to be reported lost", func(ctx context.Context) bool {
		for _, id := range lostIDs {
			sb, err := c.GetSandbox(ctx, id)
			if err != nil || sb.State != api.StateLost {
				return false
			}
		}
		return true
	})
	n, err := c.GetNode(ctx, victim.id)
	if err != nil || n.State != api.NodeDown {
		t.Fatalf("killed edge's node: %+v, %v", n, err)
	}
	for _, id := range lostIDs {
		start := time.Now()
		_, err := c.Exec(ctx, id, &api.ExecRequest{Cmd: []string{"true"}})
		if errdefs.Code(err) != api.CodeFailedPrecondition || time.Since(start) > 5*time.Second {
			t.Fatalf("exec on lost sandbox %s: %v after %s", id, err, time.Since(start))
		}
	}
	for _, e := range edges[1:] {
		for _, id := range byNode[e.id] {
			if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != api.StateRunning {
				t.Fatalf("sandbox %s on a live edge: %+v, %v", id, sb, err)
			}
		}
	}
	for range 6 {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		sb, err := c.CreateSandbox(cctx, req)
		ccancel()
		if err != nil {
			t.Fatalf("create after the loss: %v", err)
		}
		if sb.Node == victim.id {
			t.Fatalf("sandbox %s placed on the dead edge", sb.ID)
		}
		if res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec on %s: %+v, %v", sb.ID, res, err)
		}
	}
	for _, id := range lostIDs {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatalf("delete lost sandbox %s: %v", id, err)
		}
	}
}
