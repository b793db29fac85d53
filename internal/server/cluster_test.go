package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/client"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/server"
	"github.com/dsec-project/dsec/internal/sim"
	"github.com/dsec-project/dsec/internal/store"
	"github.com/dsec-project/dsec/internal/store/postgres"
	"github.com/dsec-project/dsec/internal/store/sqlite"
	"github.com/dsec-project/dsec/internal/testutil"
)

const baseDigest = "sha256:" + "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01"

// replica is one control plane over simulated nodes, served over HTTP.
type replica struct {
	srv    *server.Server
	client *client.Client
	url    string
	store  store.Store
}

func newReplica(t *testing.T, st store.Store, c *sim.Cluster, keyPath string) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv := server.New(server.Config{
		Store: st, Scheduler: scheduler.New(scheduler.DefaultConfig), NewNodeClient: c.NewClient,
		// Heartbeats go every 100 ms; a node is down after 5 s of silence,
		// long enough that a loaded CI machine never takes a live one for
		// dead (which marks its sandboxes lost under a running create).
		NodeTimeout: 5 * time.Second, SyncInterval: 50 * time.Millisecond, ReapInterval: time.Hour,
		Logger: testLogger(),
	})
	key, err := server.Bootstrap(ctx, st, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutLayer(ctx, store.Layer{Tenant: server.AdminTenant, Name: "base", Tag: "minimal", Digest: baseDigest,
		Kind: api.KindBase, Public: true, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	go srv.Run(ctx)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); cancel() })
	return &replica{srv: srv, client: client.New(hs.URL, key), url: hs.URL, store: st}
}

func openSQLite(t *testing.T) store.Store {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "dsec.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// heartbeats sends the live nodes' heartbeats to cp every 100 ms until the
// test ends.
func heartbeats(t *testing.T, c *sim.Cluster, r *replica) {
	t.Helper()
	if err := c.Heartbeat(context.Background(), r.srv); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				c.Heartbeat(ctx, r.srv)
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func addNodes(t *testing.T, c *sim.Cluster, n int, capacity api.Resources, labels map[string]string, prefix string) []*sim.Node {
	t.Helper()
	var out []*sim.Node
	for i := range n {
		node, err := c.Add(context.Background(), fmt.Sprintf("%s%d", prefix, i), capacity, labels)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, node)
	}
	return out
}

func small() *api.CreateSandboxRequest {
	return &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"}, Resources: api.Resources{CPU: 0.5, MemoryMB: 100}}
}

// utilisation reads the replica's view of the regular nodes' utilisation
// from its metrics.
func utilisation(t *testing.T, r *replica) float64 {
	t.Helper()
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "dsec_cluster_utilisation "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatal("no dsec_cluster_utilisation in /metrics")
	return 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, 30*time.Second, what, cond)
}

func TestClusterSpreadsAndSurvivesANodeLoss(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	nodes := addNodes(t, c, 3, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")
	// Every node has the base cached, as in a cluster that ran it before:
	// otherwise the layer affinity of the first nodes whose heartbeats
	// report it after their first create (soon, when creates are slow, as
	// under -race) outweighs the free room of a node that has none yet.
	for _, n := range nodes {
		n.CacheLayers(baseDigest)
	}
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)

	var ids []string
	per := map[string]int{}
	for range 30 {
		sb, err := r.client.CreateSandbox(ctx, small())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		per[sb.Node]++
	}
	for _, n := range nodes {
		if per[n.ID] < 5 || n.Backend.Count() != per[n.ID] {
			t.Fatalf("node %s: %d records, %d on the node; want a share of 30 (%v)", n.ID, per[n.ID], n.Backend.Count(), per)
		}
	}

	victim := nodes[0]
	victim.Kill()
	waitFor(t, "the dead node's sandboxes to be lost", func() bool {
		list, err := r.client.ListSandboxes(ctx, client.ListOptions{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		lost := 0
		for _, sb := range list.Sandboxes {
			if sb.State == api.StateLost {
				if sb.Node != victim.ID {
					t.Fatalf("sandbox %s on %s reported lost", sb.ID, sb.Node)
				}
				lost++
			}
		}
		return lost == per[victim.ID]
	})
	ns, err := r.client.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if want := map[bool]string{true: api.NodeDown, false: api.NodeUp}[n.ID == victim.ID]; n.State != want {
			t.Fatalf("node %s is %s, want %s", n.ID, n.State, want)
		}
	}
	for range 10 {
		sb, err := r.client.CreateSandbox(ctx, small())
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node == victim.ID {
			t.Fatalf("sandbox placed on the dead node")
		}
	}
	for _, id := range ids {
		sb, err := r.client.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node != victim.ID {
			continue
		}
		start := time.Now()
		_, err = r.client.Exec(ctx, id, &api.ExecRequest{Cmd: []string{"true"}})
		if errdefs.Code(err) != api.CodeFailedPrecondition || time.Since(start) > 5*time.Second {
			t.Fatalf("exec on a lost sandbox: %v after %s; want failed_precondition at once", err, time.Since(start))
		}
		if err := r.client.DeleteSandbox(ctx, id); err != nil {
			t.Fatalf("delete a lost sandbox: %v", err)
		}
	}
	if n, _ := r.store.GetNode(ctx, victim.ID); n.Sandboxes != 0 || n.Allocated.MemoryMB != 0 {
		t.Fatalf("deleting the lost sandboxes left charges on the dead node: %+v", n)
	}
}

func TestClusterRetriesRefusals(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	nodes := addNodes(t, c, 3, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")
	nodes[1].Backend.Refuse = func(backend.Spec) error {
		return fmt.Errorf("out of disk: %w", errdefs.ErrResourceExhausted)
	}
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)
	for range 12 {
		sb, err := r.client.CreateSandbox(ctx, small())
		if err != nil {
			t.Fatal(err)
		}
		if sb.Node == nodes[1].ID || sb.State != api.StateRunning {
			t.Fatalf("sandbox on the refusing node: %+v", sb)
		}
	}
	if n, _ := r.store.GetNode(ctx, nodes[1].ID); n.Sandboxes != 0 || nodes[1].Backend.Count() != 0 {
		t.Fatalf("the refusing node holds charges or sandboxes: %+v", n)
	}
	if nodes[0].Backend.Count()+nodes[2].Backend.Count() != 12 {
		t.Fatal("sandboxes missing")
	}
}

// A create that every node with room refused answers with the node's own
// reason and class, not with "no node has room" (nor "context canceled",
// which the call's cancelled context once made of every refusal).
func TestCreateRefusedByTheOnlyNode(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	nodes := addNodes(t, c, 1, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")
	nodes[0].Backend.Refuse = func(backend.Spec) error {
		return fmt.Errorf("the guest stopped while booting: %w", errdefs.ErrUnavailable)
	}
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)
	_, err := r.client.CreateSandbox(ctx, small())
	if client.Code(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "the guest stopped while booting") ||
		!strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "canceled") {
		t.Fatalf("create on a refusing node: %v (code %s)", err, client.Code(err))
	}
	if n, _ := r.store.GetNode(ctx, nodes[0].ID); n.Sandboxes != 0 || n.Allocated.MemoryMB != 0 {
		t.Fatalf("the refused create left charges: %+v", n)
	}
}

func TestClusterDrainQuotaBurst(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	regular := addNodes(t, c, 2, api.Resources{CPU: 8, MemoryMB: 1000}, nil, "n")
	cloud := addNodes(t, c, 1, api.Resources{CPU: 8, MemoryMB: 1000}, map[string]string{"pool": "burst"}, "cloud")[0]
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)

	t.Run("drain", func(t *testing.T) {
		if _, err := r.client.DrainNode(ctx, regular[0].ID, true); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			sb, err := r.client.CreateSandbox(ctx, small())
			if err != nil || sb.Node != regular[1].ID {
				t.Fatalf("create with n0 draining: %+v, %v", sb, err)
			}
			r.client.DeleteSandbox(ctx, sb.ID)
		}
		n, err := r.client.DrainNode(ctx, regular[0].ID, false)
		if err != nil || n.State != api.NodeUp {
			t.Fatalf("undrain: %+v, %v", n, err)
		}
	})

	t.Run("quota", func(t *testing.T) {
		tn, err := r.client.CreateTenant(ctx, "quota-team")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.client.SetQuota(ctx, tn.ID, api.Quota{Sandboxes: 2}); err != nil {
			t.Fatal(err)
		}
		k, err := r.client.CreateKey(ctx, tn.ID, false)
		if err != nil {
			t.Fatal(err)
		}
		tc := client.New(r.url, k.Secret)
		var got []string
		for i := range 3 {
			sb, err := tc.CreateSandbox(ctx, small())
			if i < 2 && err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				if errdefs.Code(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "quota") {
					t.Fatalf("third create over a quota of 2: %v", err)
				}
				break
			}
			got = append(got, sb.ID)
		}
		full, _ := r.client.GetTenant(ctx, tn.ID)
		if full.Usage.Sandboxes != 2 {
			t.Fatalf("usage = %+v", full.Usage)
		}
		tc.DeleteSandbox(ctx, got[0])
		if _, err := tc.CreateSandbox(ctx, small()); err != nil {
			t.Fatalf("create after freeing one: %v", err)
		}
	})

	t.Run("burst", func(t *testing.T) {
		// The quota subtest left 2 of 100 MB; fill to 85% of 2000 MB with
		// sandboxes that may not burst: none may land on the cloud node.
		// (85%, not 80%: this replica's view may lag a create behind.)
		var placed []string
		for range 15 {
			sb, err := r.client.CreateSandbox(ctx, small())
			if err != nil {
				t.Fatal(err)
			}
			if sb.Node == cloud.ID {
				t.Fatalf("a sandbox without burst consent ran on the burst node")
			}
			placed = append(placed, sb.ID)
		}
		// The scheduler's view catches up with the store within a sync.
		waitFor(t, "utilisation at 85%", func() bool { return utilisation(t, r) >= 0.849 })
		req := small()
		req.Burst = true
		sb, err := r.client.CreateSandbox(ctx, req)
		if err != nil || sb.Node != cloud.ID || !sb.Burst {
			t.Fatalf("burst-eligible create above 80%%: %+v, %v; want the cloud node", sb, err)
		}
		for _, id := range placed[:6] {
			r.client.DeleteSandbox(ctx, id)
		}
		waitFor(t, "utilisation under 80%", func() bool { return utilisation(t, r) < 0.79 })
		sb, err = r.client.CreateSandbox(ctx, req)
		if err != nil || sb.Node == cloud.ID {
			t.Fatalf("burst-eligible create below 80%%: %+v, %v; want a regular node", sb, err)
		}
	})
}

// TestReplicasShareOneCluster runs two control planes over one PostgreSQL
// database. The nodes report to replica A only; B learns them from the
// store. Both take creates at once for more sandboxes than fit: exactly
// the ones that fit are made, no node goes over its memory, and no
// sandbox is made twice.
func TestReplicasShareOneCluster(t *testing.T) {
	ctx := context.Background()
	dsn := testutil.StartPostgres(t)
	open := func() store.Store {
		st, err := postgres.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	c := sim.NewCluster()
	nodes := addNodes(t, c, 3, api.Resources{CPU: 4, MemoryMB: 1000}, nil, "n")
	keyPath := filepath.Join(t.TempDir(), "admin.key")
	a := newReplica(t, open(), c, keyPath)
	b := newReplica(t, open(), c, keyPath)
	heartbeats(t, c, a)
	waitFor(t, "replica B to see the nodes", func() bool {
		_, err := b.client.CreateSandbox(ctx, &api.CreateSandboxRequest{Layers: &api.LayerRefs{Base: "base:minimal"},
			Resources: api.Resources{CPU: 0.1, MemoryMB: 16}, TTLSeconds: 1})
		return err == nil
	})

	var mu sync.Mutex
	ok, ids := 0, map[string]bool{}
	var wg sync.WaitGroup
	for i := range 80 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep := []*replica{a, b}[i%2]
			sb, err := rep.client.CreateSandbox(ctx, small())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
				if ids[sb.ID] {
					t.Errorf("sandbox %s made twice", sb.ID)
				}
				ids[sb.ID] = true
			case errdefs.Code(err) != api.CodeResourceExhausted:
				t.Errorf("unexpected create error: %v", err)
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, n := range nodes {
		rec, err := a.store.GetNode(ctx, n.ID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Allocated.MemoryMB > rec.Capacity.MemoryMB {
			t.Errorf("node %s overcommitted: %d of %d MB", n.ID, rec.Allocated.MemoryMB, rec.Capacity.MemoryMB)
		}
		total += n.Backend.Count()
	}
	// 3 nodes × 1000 MB hold 29 sandboxes of 100 MB beside the 16 MB probe.
	if ok != 29 || total != 30 {
		t.Fatalf("%d creates succeeded, %d sandboxes on nodes; want 29 and 30 (with the probe)", ok, total)
	}
}

func TestBatchPlacesThroughTheStore(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	nodes := addNodes(t, c, 4, api.Resources{CPU: 16, MemoryMB: 100000}, nil, "n")
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)
	tn, _ := r.client.CreateTenant(ctx, "batch-team")
	r.client.SetQuota(ctx, tn.ID, api.Quota{Sandboxes: 1500})
	k, err := r.client.CreateKey(ctx, tn.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	tc := client.New(r.url, k.Secret)

	res, err := tc.CreateBatch(ctx, &api.BatchCreateRequest{Count: 2000, CreateSandboxRequest: *small()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, quota := 0, 0
	for _, it := range res.Items {
		switch {
		case it.Error == nil:
			ok++
		case it.Error.Code == api.CodeResourceExhausted && strings.Contains(it.Error.Message, "quota"):
			quota++
		default:
			t.Fatalf("item error: %v", it.Error)
		}
	}
	if ok != 1500 || quota != 500 || res.Created != 1500 {
		t.Fatalf("%d made, %d over quota (result %+v); want 1500 and 500", ok, quota, res.Created)
	}
	for _, n := range nodes {
		if got := n.Backend.Count(); got < 300 {
			t.Fatalf("node %s got %d of 1500: batch not spread", n.ID, got)
		}
	}
	if u, _ := r.store.Usage(ctx, tn.ID); u.Sandboxes != 1500 {
		t.Fatalf("tenant usage after the batch: %+v", u)
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("DSEC_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// TestReconcileRacesCreates: creates that finish while a reconcile of
// their node is under way are neither failed as lost nor destroyed as
// orphans, whether they finish after the node's list was taken or before.
func TestReconcileRacesCreates(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	nodes := addNodes(t, c, 1, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)
	ec, err := c.NewClient(nodes[0].Addr(), nodes[0].Token())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		hold func(n *sim.Node, f func())
	}{
		{"after the list", func(n *sim.Node, f func()) { n.OnNextList(nil, f) }},
		{"before the list", func(n *sim.Node, f func()) { n.OnNextList(f, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held, release := make(chan struct{}), make(chan struct{})
			tc.hold(nodes[0], func() { close(held); <-release })
			done := make(chan error, 1)
			go func() { done <- server.Reconcile(r.srv, ctx, nodes[0].ID, ec) }()
			<-held
			sb, err := r.client.CreateSandbox(ctx, small())
			close(release)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got, err := r.client.GetSandbox(ctx, sb.ID)
			if err != nil || got.State != api.StateRunning {
				t.Fatalf("after the reconcile: %+v, %v; want running", got, err)
			}
			if _, err := nodes[0].Backend.State(ctx, sb.ID); err != nil {
				t.Fatalf("the node no longer runs it: %v", err)
			}
		})
	}
}

// TestCreateSurvivesARecordChangedWhileBuilding: a record changed while
// its node builds the sandbox — a reconcile that found it there first and
// marked it running, or a node declared down for a moment that marked it
// lost — is read again, and the create still answers running (it failed
// with "record changed concurrently" and destroyed the sandbox before).
func TestCreateSurvivesARecordChangedWhileBuilding(t *testing.T) {
	ctx := context.Background()
	c := sim.NewCluster()
	nodes := addNodes(t, c, 1, api.Resources{CPU: 8, MemoryMB: 10000}, nil, "n")
	r := newReplica(t, openSQLite(t), c, filepath.Join(t.TempDir(), "admin.key"))
	heartbeats(t, c, r)
	for _, state := range []string{api.StateRunning, api.StateLost} {
		nodes[0].Backend.Refuse = func(spec backend.Spec) error {
			sb, err := r.store.GetSandbox(ctx, spec.ID)
			if err != nil {
				return err
			}
			sb.API.State = state
			return r.store.UpdateSandbox(ctx, &sb)
		}
		sb, err := r.client.CreateSandbox(ctx, small())
		if err != nil {
			t.Fatalf("record made %s while building: %v", state, err)
		}
		got, err := r.store.GetSandbox(ctx, sb.ID)
		if err != nil || sb.State != api.StateRunning || got.API.State != api.StateRunning {
			t.Fatalf("record made %s while building: answered %s, stored %s (%v)", state, sb.State, got.API.State, err)
		}
	}
	nodes[0].Backend.Refuse = nil
	if n := nodes[0].Backend.Count(); n != 2 {
		t.Fatalf("the node holds %d sandboxes, want the 2 made", n)
	}
}
