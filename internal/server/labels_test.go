package server_test

import (
	"strings"

	"context"
	"github.com/dsec-project/dsec/client"
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
	// A pool sandbox as the FnCall pools make it: labelled by the server
	// (a request may not set the label).
	pooled := func() string {
		sb, err := r.client.CreateSandbox(ctx, small())
		if err != nil {
			t.Fatal(err)
		}
		rec, err := st.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		rec.API.Labels = map[string]string{api.LabelFnCallPool: "fp-test"}
		if err := st.UpdateSandbox(ctx, &rec); err != nil {
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

// TestServerLabelsRefused: a create, batch or fork may not set a label the
// server sets; one labelled as a pool's would be guarded from its owner
// and destroyed at the next restart.
func TestServerLabelsRefused(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	addNodes(t, c, 1, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)
	parent, err := r.client.CreateSandbox(ctx, small())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{api.LabelFnCallPool, "dsec.build", api.LabelBatch, api.LabelFork, api.LabelForkOf} {
		labels := map[string]string{k: "x", "mine": "y"}
		req := small()
		req.Labels = labels
		_, err := r.client.CreateSandbox(ctx, req)
		_, berr := r.client.CreateBatch(ctx, &api.BatchCreateRequest{Count: 1, CreateSandboxRequest: *req}, nil)
		_, ferr := r.client.Fork(ctx, parent.ID, &api.ForkRequest{Count: 1, Labels: labels})
		for what, err := range map[string]error{"create": err, "batch": berr, "fork": ferr} {
			if client.Code(err) != api.CodeInvalid || !strings.Contains(err.Error(), k) {
				t.Errorf("%s with label %s: %v; want invalid_argument naming it", what, k, err)
			}
		}
	}
	req := small()
	req.Labels = map[string]string{"dsec.mine": "y"} // not the server's
	if _, err := r.client.CreateSandbox(ctx, req); err != nil {
		t.Fatal(err)
	}
}
