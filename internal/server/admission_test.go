package server_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/sim"
)

// TestAdmissionWaitsForBusyNodes: creates that only find busy nodes wait
// in the admission queue (shown in GET /v1/nodes and the metrics) and are
// placed once the node's load falls; memory still fails at once, and a
// create's own admission timeout bounds its wait. The node's load is
// simulated.
func TestAdmissionWaitsForBusyNodes(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	node := addNodes(t, c, 1, api.Resources{CPU: 2, MemoryMB: 4000}, nil, "n")[0]
	node.SetLoad(api.NodeLoad{CPU: 2, SandboxCPU: 1.95})
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)

	nodes, err := r.client.NodeList(ctx)
	if err != nil || len(nodes.Nodes) != 1 || !nodes.Nodes[0].Busy || nodes.Admission == nil {
		t.Fatalf("GET /v1/nodes with a busy node: %+v, %v", nodes, err)
	}

	t.Run("memory and no-wait creates fail at once", func(t *testing.T) {
		start := time.Now()
		big := small()
		big.Resources.MemoryMB = 8000
		_, err := r.client.CreateSandbox(ctx, big)
		if errdefs.Code(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "no node has room") {
			t.Fatalf("create larger than the node: %v; want resource_exhausted at once", err)
		}
		now := small()
		now.AdmissionTimeoutSeconds = -1
		_, err = r.client.CreateSandbox(ctx, now)
		if errdefs.Code(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "busy") {
			t.Fatalf("create that may not wait: %v; want resource_exhausted naming busy nodes", err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("refusals took %v: they must not wait", d)
		}
	})

	t.Run("a create's own timeout bounds its wait", func(t *testing.T) {
		req := small()
		req.AdmissionTimeoutSeconds = 1
		_, err := r.client.CreateSandbox(ctx, req)
		if errdefs.Code(err) != api.CodeDeadlineExceeded || !strings.Contains(err.Error(), "busy") {
			t.Fatalf("create with a 1 s admission timeout: %v; want deadline_exceeded naming busy nodes", err)
		}
	})

	t.Run("waiting creates are placed when load falls", func(t *testing.T) {
		var clients []*client.Client
		for _, name := range []string{"team-a", "team-b"} {
			tn, err := r.client.CreateTenant(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			k, err := r.client.CreateKey(ctx, tn.ID, false)
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, client.New(r.url, k.Secret))
		}
		const each = 3
		var wg sync.WaitGroup
		errs := make(chan error, 2*each+1)
		for _, tc := range clients {
			for range each {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := tc.CreateSandbox(ctx, small())
					errs <- err
				}()
			}
		}
		// A batch's items wait the same way, as the single creates do.
		var batch *api.BatchResult
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			batch, err = clients[0].CreateBatch(ctx, &api.BatchCreateRequest{CreateSandboxRequest: *small(), Count: 4}, nil)
			errs <- err
		}()
		waitFor(t, "10 creates to queue", func() bool {
			nl, err := r.client.NodeList(ctx)
			return err == nil && nl.Admission.Waiting == 2*each+4 && nl.Admission.Tenants == 2
		})
		if m := metrics(t, r); !strings.Contains(m, "dsec_admission_waiting 10") || !strings.Contains(m, "dsec_nodes_busy 1") {
			t.Fatalf("metrics do not show the queue:\n%s", m)
		}
		node.SetLoad(api.NodeLoad{CPU: 0.5, SandboxCPU: 0.4})
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("a waiting create failed: %v", err)
			}
		}
		if batch.Created != 4 {
			t.Fatalf("batch: %d of 4 created: %+v", batch.Created, batch.Items)
		}
		nl, err := r.client.NodeList(ctx)
		if err != nil || nl.Admission.Waiting != 0 || nl.Admission.Admitted != 2*each+4 || nl.Nodes[0].Busy {
			t.Fatalf("after the load fell: %+v, %v", nl.Admission, err)
		}
		if m := metrics(t, r); !strings.Contains(m, `dsec_admission_wait_seconds_count{result="admitted"} 10`) {
			t.Fatalf("metrics do not count the admitted waits:\n%s", m)
		}
	})
}

func metrics(t *testing.T, r *replica) string {
	t.Helper()
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
