package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/testutil"
)

// TestNoLeaks creates and destroys 200 sandboxes, 8 at a time, each running
// a command and a background process, and then checks that no directory,
// socket, mount, container, cgroup or process is left.
func TestNoLeaks(t *testing.T) {
	testutil.Short(t)
	s := startServer(t)
	c := s.Client
	ctx := ctxT(t)
	const total, parallel = 200, 8
	errs := make(chan error, total)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range total {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- cycle(ctx, c, i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	testutil.RequireNoSandboxLeft(t, s)
}

func cycle(ctx context.Context, c interface {
	CreateSandbox(context.Context, *api.CreateSandboxRequest) (*api.Sandbox, error)
	Exec(context.Context, string, *api.ExecRequest) (*api.ExecResult, error)
	DeleteSandbox(context.Context, string) error
}, i int) error {
	sb, err := c.CreateSandbox(ctx, &api.CreateSandboxRequest{
		Layers: &api.LayerRefs{Base: "base:minimal"}, Resources: api.Resources{MemoryMB: 64},
	})
	if err != nil {
		return fmt.Errorf("create %d: %w", i, err)
	}
	if _, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "sleep 1000", Background: true}); err != nil {
		return fmt.Errorf("background exec %d: %w", i, err)
	}
	res, err := c.Exec(ctx, sb.ID, &api.ExecRequest{Shell: "echo $DSEC_SANDBOX_ID > /tmp/id; cat /tmp/id"})
	if err != nil || res.Stdout != sb.ID+"\n" {
		return fmt.Errorf("exec %d: %v %+v", i, err, res)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		return fmt.Errorf("delete %d: %w", i, err)
	}
	return nil
}
