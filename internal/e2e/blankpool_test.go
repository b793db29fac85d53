package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestBlankPool: by default the node keeps blank sandboxes (at least 2,
// at most 32), reports them in GET /v1/nodes, and creates claim them: the
// sandbox has its own id as host name and in its environment, and its
// limits. A server stopped by SIGTERM leaves nothing, blank sandboxes
// included.
func TestBlankPool(t *testing.T) {
	s := startServer(t, "--heartbeat", "200ms")
	c := s.Client
	ctx := ctxT(t)
	pool := func() *api.BlankPool {
		nl, err := c.NodeList(ctx)
		if err != nil || len(nl.Nodes) != 1 {
			t.Fatalf("nodes: %+v %v", nl, err)
		}
		return nl.Nodes[0].Load.BlankPool
	}
	waitFor := func(what string, ok func(p *api.BlankPool) bool) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, what, func() error {
			if p := pool(); p == nil || !ok(p) {
				return fmt.Errorf("the node reports %+v", p)
			}
			return nil
		})
	}
	waitFor("two blank sandboxes", func(p *api.BlankPool) bool { return p.Size >= 2 && p.Max == 32 })
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Layers: &api.LayerRefs{Base: "base:minimal"}, Resources: api.Resources{MemoryMB: 96},
		Env: map[string]string{"FROM": "pool"},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := sh(t, c, sb.ID, "hostname; echo $DSEC_SANDBOX_ID $FROM; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max")
	if want := sb.ID + "\n" + sb.ID + " pool\n" + "100663296\n"; out != want {
		t.Fatalf("claimed sandbox says %q, want %q", out, want)
	}
	waitFor("a claim", func(p *api.BlankPool) bool { return p.Claims >= 1 })
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	testutil.RequireNoSandboxLeft(t, s)
}
