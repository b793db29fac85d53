package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

// deleteAll destroys every live sandbox of the admin tenant.
func deleteAll(t *testing.T, c *client.Client) {
	t.Helper()
	ctx := ctxT(t)
	for {
		list, err := c.ListSandboxes(ctx, client.ListOptions{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range list.Sandboxes {
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Fatalf("delete %s: %v", sb.ID, err)
			}
		}
		if len(list.Sandboxes) == 0 {
			return
		}
	}
}

// waitNoPools waits until the tenant's FnCall pools have shrunk away.
func waitNoPools(t *testing.T, c *client.Client) {
	t.Helper()
	testutil.Eventually(t, 2*time.Minute, "the pools gone", func() error {
		pools, err := c.ListPools(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(pools.Pools) != 0 {
			return fmt.Errorf("pools still there: %+v", pools.Pools)
		}
		return nil
	})
}

func liveWithLabel(t *testing.T, c *client.Client, k, v string) []api.Sandbox {
	t.Helper()
	list, err := c.ListSandboxes(ctxT(t), client.ListOptions{Labels: map[string]string{k: v}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return list.Sandboxes
}

// TestBatchCreate: a batch is placed, recorded and built as a whole, each
// sandbox works on its own, partial failure is per item, and a client that
// leaves mid-batch leaves nothing behind.
func TestBatchCreate(t *testing.T) {
	s := startServer(t, "--batch-parallel", "4")
	c := s.Client
	ctx := ctxT(t)
	spec := api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"},
		Resources: api.Resources{MemoryMB: 32}, Labels: map[string]string{"job": "b1"}}

	t.Run("all created, streamed with progress", func(t *testing.T) {
		var events, lastDone atomic.Int64
		res, err := c.CreateBatch(ctx, &api.BatchCreateRequest{Count: 12, CreateSandboxRequest: spec}, func(p api.BatchProgress) {
			events.Add(1)
			if p.Total != 12 || int64(p.Created+p.Failed) < lastDone.Load() {
				t.Errorf("progress went wrong: %+v", p)
			}
			lastDone.Store(int64(p.Created + p.Failed))
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Created != 12 || res.Failed != 0 || len(res.Items) != 12 || events.Load() < 2 || lastDone.Load() != 12 {
			t.Fatalf("result %+v after %d progress events (last %d done)", res, events.Load(), lastDone.Load())
		}
		ids := map[string]bool{}
		for i, it := range res.Items {
			if it.Index != i || it.State != api.StateRunning || it.ID == "" || it.Error != nil || ids[it.ID] {
				t.Fatalf("item %d: %+v", i, it)
			}
			ids[it.ID] = true
		}
		got := liveWithLabel(t, c, api.LabelBatch, res.Batch)
		if len(got) != 12 || got[0].Labels["job"] != "b1" {
			t.Fatalf("listed by the batch label: %d sandboxes, labels %v", len(got), got[0].Labels)
		}
		// Sandboxes of a batch are independent.
		a, b := res.Items[0].ID, res.Items[11].ID
		sh(t, c, a, "echo mine > /tmp/f")
		if out := sh(t, c, b, "cat /tmp/f 2>/dev/null || echo none"); out != "none\n" {
			t.Fatalf("sandbox %s sees %q written in %s", b, out, a)
		}
	})

	t.Run("partial success", func(t *testing.T) {
		deleteAll(t, c)
		nodes, err := c.ListNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := nodes[0]
		free := n.Capacity.MemoryMB - n.Allocated.MemoryMB
		big := spec
		big.Resources.MemoryMB = free/3 + 1 // two fit, not three
		res, err := c.CreateBatch(ctx, &api.BatchCreateRequest{Count: 4, CreateSandboxRequest: big}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Created != 2 || res.Failed != 2 {
			t.Fatalf("result %+v; want 2 created and 2 failed", res)
		}
		for _, it := range res.Items[2:] {
			if it.Error == nil || it.Error.Code != api.CodeResourceExhausted || it.ID != "" {
				t.Fatalf("failed item %+v; want resource_exhausted without an id", it)
			}
		}
		deleteAll(t, c)
	})

	t.Run("client leaves mid-batch", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		_, err := c.CreateBatch(cctx, &api.BatchCreateRequest{Count: 40, CreateSandboxRequest: spec}, func(p api.BatchProgress) {
			if p.Created > 0 {
				cancel()
			}
		})
		cancel()
		if err == nil {
			t.Fatal("a cancelled batch returned no error")
		}
		// Every sandbox the batch made is destroyed; nothing stays behind.
		testutil.Eventually(t, 2*time.Minute, "the abandoned batch's sandboxes gone", func() error {
			list, err := c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"job": "b1"}, Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Sandboxes) != 0 {
				return fmt.Errorf("%d sandboxes of an abandoned batch still live", len(list.Sandboxes))
			}
			return nil
		})
		all, err := c.ListSandboxes(ctx, client.ListOptions{All: true, Labels: map[string]string{"job": "b1"}, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range all.Sandboxes {
			if sb.State != api.StateDeleted && sb.State != api.StateFailed {
				t.Fatalf("sandbox %s of the abandoned batch is %s", sb.ID, sb.State)
			}
		}
		testutil.RequireNoSandboxLeft(t, s)
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			req  api.BatchCreateRequest
		}{
			{"count 0", api.BatchCreateRequest{Count: 0, CreateSandboxRequest: spec}},
			{"count over the limit", api.BatchCreateRequest{Count: api.MaxBatchCount + 1, CreateSandboxRequest: spec}},
			{"unknown backend", api.BatchCreateRequest{Count: 2, CreateSandboxRequest: api.CreateSandboxRequest{
				Backend: "quantum", Layers: spec.Layers}}},
			{"fncall backend", api.BatchCreateRequest{Count: 2, CreateSandboxRequest: api.CreateSandboxRequest{
				Backend: api.BackendFnCall, Layers: spec.Layers}}},
			{"batch label set by hand", api.BatchCreateRequest{Count: 2, CreateSandboxRequest: api.CreateSandboxRequest{
				Layers: spec.Layers, Labels: map[string]string{api.LabelBatch: "mine"}}}},
			{"no layers", api.BatchCreateRequest{Count: 2}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := c.CreateBatch(ctx, &tc.req, nil)
				if !client.IsInvalid(err) {
					t.Fatalf("got %v; want invalid_argument", err)
				}
			})
		}
	})
}
