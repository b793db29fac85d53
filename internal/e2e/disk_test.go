package e2e

import (
	"strings"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// TestDiskIsPlacedHard: a node's writable-layer disk is charged like
// memory. The node offers 3000 MB (--disk-mb) promised once
// (--disk-overcommit 1): a create whose disk_mb does not fit, or no longer
// fits, fails at once with a 429 that names the disk; a delete gives the
// room back.
func TestDiskIsPlacedHard(t *testing.T) {
	s := startServer(t, "--disk-mb", "3000", "--disk-overcommit", "1")
	c := s.Client
	ctx := ctxT(t)
	req := func(diskMB int64) *api.CreateSandboxRequest {
		return &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"},
			Resources: api.Resources{MemoryMB: 32, DiskMB: diskMB}}
	}
	tooBig := func(what string, diskMB int64) {
		t.Helper()
		_, err := c.CreateSandbox(ctx, req(diskMB))
		if errdefs.Code(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "MB disk") {
			t.Fatalf("%s: %v; want resource_exhausted naming the disk", what, err)
		}
	}
	tooBig("a create larger than the node's disk", 4096)

	a, err := c.CreateSandbox(ctx, req(1024))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, req(1024)); err != nil {
		t.Fatal(err)
	}
	tooBig("a create past the node's disk", 1024)
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := nodes[0]
	if n.Capacity.DiskMB != 3000 || n.Limit.DiskMB != 3000 || n.Allocated.DiskMB != 2048 || n.Load.DiskUsedMB <= 0 {
		t.Fatalf("node disk: capacity %d, limit %d, allocated %d, used %d; want 3000, 3000, 2048, > 0",
			n.Capacity.DiskMB, n.Limit.DiskMB, n.Allocated.DiskMB, n.Load.DiskUsedMB)
	}

	if err := c.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateSandbox(ctx, req(1024))
	if err != nil {
		t.Fatalf("create after a delete freed the disk: %v", err)
	}
	sh(t, c, b.ID, "echo ok > /tmp/x")
}
