package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/testutil"
)

func createWith(t *testing.T, c *client.Client, req api.CreateSandboxRequest) *api.Sandbox {
	t.Helper()
	req.Layers = &api.LayerRefs{Base: "base:minimal"}
	req.Resources.MemoryMB = 128
	sb, err := c.CreateSandbox(ctxT(t), &req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), sb.ID) })
	return sb
}

// waitReaped waits until the reaper destroyed a sandbox and returns it.
func waitReaped(t *testing.T, c *client.Client, id string, within time.Duration) *api.Sandbox {
	t.Helper()
	var sb *api.Sandbox
	testutil.Eventually(t, within, "sandbox "+id+" reaped", func() error {
		var err error
		if sb, err = c.GetSandbox(ctxT(t), id); err != nil {
			return err
		}
		if sb.State != api.StateDeleted {
			return fmt.Errorf("%+v", sb)
		}
		return nil
	})
	return sb
}

// TestLeases: a lease is renewable, a sandbox whose lease ends or that
// idles past its idle timeout is reaped without leaving anything behind,
// and the Go client's Keepalive holds a sandbox as long as it runs.
func TestLeases(t *testing.T) {
	s := startServer(t)
	t.Run("group", func(t *testing.T) { leaseCases(t, s) })
	testutil.RequireNoSandboxLeft(t, s)
}

func leaseCases(t *testing.T, s *testutil.Server) {
	c := s.Client
	ctx := ctxT(t)
	t.Run("renew moves the lease end", func(t *testing.T) {
		t.Parallel()
		sb := createWith(t, c, api.CreateSandboxRequest{TTLSeconds: 600})
		if sb.TTLSeconds != 600 || sb.ExpiresAt == nil || sb.LastActiveAt == nil {
			t.Fatalf("created %+v", sb)
		}
		r, err := c.Renew(ctx, sb.ID, time.Hour)
		if err != nil || r.ExpiresAt.Sub(*sb.ExpiresAt) < 50*time.Minute || r.TTLSeconds != 600 {
			t.Fatalf("renew 1h: %+v %v", r, err)
		}
		r, err = c.Renew(ctx, sb.ID, 0) // back to its own ttl, from now
		if err != nil || r.ExpiresAt.After(time.Now().Add(601*time.Second)) {
			t.Fatalf("renew with its own ttl: %+v %v", r, err)
		}
		for name, ttl := range map[string]time.Duration{"negative": -2 * time.Second, "over the max": 8 * 24 * time.Hour} {
			if _, err := c.Renew(ctx, sb.ID, ttl); !client.IsInvalid(err) {
				t.Errorf("renew %s: %v", name, err)
			}
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Renew(ctx, sb.ID, 0); !client.IsNotFound(err) {
			t.Fatalf("renew a deleted sandbox: %v", err)
		}
		if _, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"},
			IdleTimeoutSeconds: -1}); !client.IsInvalid(err) {
			t.Fatalf("negative idle timeout: %v", err)
		}
	})

	t.Run("an ended lease is reaped", func(t *testing.T) {
		t.Parallel()
		sb := createWith(t, c, api.CreateSandboxRequest{TTLSeconds: 1})
		sh(t, c, sb.ID, "sleep 1000 > /dev/null 2>&1 &")
		got := waitReaped(t, c, sb.ID, 30*time.Second)
		if !strings.Contains(got.Error, "lease ended") {
			t.Fatalf("reaped without a reason: %+v", got)
		}
	})

	t.Run("keepalive holds a sandbox", func(t *testing.T) {
		t.Parallel()
		sb := createWith(t, c, api.CreateSandboxRequest{TTLSeconds: 1})
		k := c.Keepalive(ctx, sb.ID, 0)
		time.Sleep(3 * time.Second) // sleep: three leases must pass for keepalive to be what holds it
		if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != api.StateRunning {
			t.Fatalf("kept-alive sandbox after 3 s: %+v %v", got, err)
		}
		if err := k.Stop(); err != nil {
			t.Fatalf("keepalive: %v", err)
		}
		waitReaped(t, c, sb.ID, 30*time.Second)
	})

	t.Run("idle timeout", func(t *testing.T) {
		t.Parallel()
		sb := createWith(t, c, api.CreateSandboxRequest{IdleTimeoutSeconds: 2})
		if sb.IdleTimeoutSeconds != 2 {
			t.Fatalf("created %+v", sb)
		}
		// A call that lasts longer than the timeout keeps it busy, and so
		// does a series of short ones.
		sh(t, c, sb.ID, "sleep 2.5")
		for range 4 {
			sh(t, c, sb.ID, "true")
			time.Sleep(500 * time.Millisecond) // sleep: short calls spread past the idle timeout are the case
		}
		if got, _ := c.GetSandbox(ctx, sb.ID); got.State != api.StateRunning {
			t.Fatalf("active sandbox was reaped: %+v", got)
		}
		got := waitReaped(t, c, sb.ID, 30*time.Second)
		if !strings.Contains(got.Error, "idle") {
			t.Fatalf("reaped without a reason: %+v", got)
		}
	})
}
