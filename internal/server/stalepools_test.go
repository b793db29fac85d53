package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/server"
	"github.com/dsec-project/dsec/internal/sim"
)

// TestRestartDestroysOnlyStalePools: a server that starts destroys the
// FnCall pool sandboxes of its previous run, but not one its own first
// call made while it was still looking for them.
func TestRestartDestroysOnlyStalePools(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	node := addNodes(t, c, 1, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")[0]
	st := openSQLite(t)
	r := newReplica(t, st, c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)
	pooled := func() string {
		req := small()
		req.Labels = map[string]string{api.LabelFnCallPool: "fp-test"}
		sb, err := r.client.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID
	}
	stale := pooled()
	// The restarted server exists (and serves) before its Run looks for
	// stale pools: what is made in between is its own.
	restarted := server.New(server.Config{
		Store: st, Scheduler: scheduler.New(scheduler.DefaultConfig), NewNodeClient: c.NewClient,
		NodeTimeout: 5 * time.Second, SyncInterval: 50 * time.Millisecond, ReapInterval: time.Hour,
		Logger: testLogger(),
	})
	fresh := pooled()
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go restarted.Run(runCtx)

	waitFor(t, "the previous run's pool sandbox destroyed", func() bool {
		sb, err := st.GetSandbox(ctx, stale)
		return err == nil && sb.API.State == api.StateDeleted
	})
	sb, err := st.GetSandbox(ctx, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if sb.API.State != api.StateRunning || node.Backend.Count() != 1 {
		t.Fatalf("the pool sandbox made after the restart: %s, %d on the node; want running, 1", sb.API.State, node.Backend.Count())
	}
}
