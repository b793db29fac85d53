package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/store"
)

// node is a node with room for memMB of memory, cpu cores (already
// overcommitted) and no pid limit.
func node(id string, cpu float64, memMB int64) store.Node {
	return store.Node{
		ID: id, Addr: "http://" + id, State: store.NodeUp,
		Capacity: api.Resources{CPU: cpu, MemoryMB: memMB},
		Limit:    api.Resources{CPU: cpu, MemoryMB: memMB},
		Backends: []string{api.BackendContainer}, LastSeen: time.Now().UTC(),
	}
}

func placed(id, nodeID, tenant string, cpu float64, memMB int64) *store.Sandbox {
	return &store.Sandbox{
		API: api.Sandbox{ID: id, State: api.StateCreating, Node: nodeID,
			Resources: api.Resources{CPU: cpu, MemoryMB: memMB, Pids: 64}, CreatedAt: time.Now().UTC()},
		Tenant: tenant,
	}
}

func mustNode(t *testing.T, s store.Store, id string) store.Node {
	t.Helper()
	n, err := s.GetNode(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func runCluster(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := context.Background()

	t.Run("nodes", func(t *testing.T) {
		s := open(t)
		n := node("n1", 100, 1024)
		n.Labels = map[string]string{"pool": "burst"}
		n.Layers = []string{"sha256:aa"}
		if err := s.UpsertNode(ctx, n); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetNode(ctx, "ghost"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("missing node: %v", err)
		}
		if err := s.SetNodeDrain(ctx, "n1", true); err != nil {
			t.Fatal(err)
		}
		// A heartbeat rewrites the description but neither state nor drain,
		// and nil Layers keeps the cached layers.
		n.State, n.Layers, n.Load = store.NodeDown, nil, api.NodeLoad{CPU: 1.5}
		n.Capacity.MemoryMB = 2048
		if err := s.UpsertNode(ctx, n); err != nil {
			t.Fatal(err)
		}
		ns, err := s.ListNodes(ctx)
		if err != nil || len(ns) != 1 {
			t.Fatalf("ListNodes = %+v, %v", ns, err)
		}
		got := ns[0]
		if got.State != store.NodeUp || !got.Drain || got.Capacity.MemoryMB != 2048 || got.Load.CPU != 1.5 ||
			!slices.Equal(got.Layers, []string{"sha256:aa"}) || got.Labels["pool"] != "burst" || got.Limit.CPU != 100 {
			t.Fatalf("after heartbeat: %+v", got)
		}
		if err := s.SetNodeDrain(ctx, "ghost", true); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("drain missing node: %v", err)
		}
		for _, tc := range []struct {
			name       string
			from       []string
			to         string
			seenBefore time.Time
			want       bool
		}{
			{"seen recently: stays up", []string{store.NodeUp}, store.NodeDown, got.LastSeen.Add(-time.Second), false},
			{"stale: goes down", []string{store.NodeUp}, store.NodeDown, got.LastSeen.Add(time.Second), true},
			{"only once", []string{store.NodeUp}, store.NodeDown, got.LastSeen.Add(time.Second), false},
			{"comes back", []string{store.NodeDown}, store.NodeUp, time.Time{}, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				changed, err := s.SetNodeState(ctx, "n1", tc.from, tc.to, tc.seenBefore)
				if err != nil || changed != tc.want {
					t.Fatalf("SetNodeState = %v, %v; want %v", changed, err, tc.want)
				}
			})
		}
	})

	t.Run("placement charges nodes and tenants within limits", func(t *testing.T) {
		s := open(t)
		for _, n := range []store.Node{node("a", 2, 1000), node("b", 100, 1000)} {
			if err := s.UpsertNode(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PlaceSandboxes(ctx, []*store.Sandbox{placed("s1", "a", "t", 1, 400), placed("s2", "a", "t", 0.5, 400)}); err != nil {
			t.Fatal(err)
		}
		if a := mustNode(t, s, "a"); a.Allocated.MemoryMB != 800 || a.Allocated.CPU != 1.5 || a.Sandboxes != 2 || a.Allocated.Pids != 128 {
			t.Fatalf("node a after placing two: %+v", a)
		}
		for _, tc := range []struct {
			name string
			sbs  []*store.Sandbox
			node string
		}{
			{"memory is hard", []*store.Sandbox{placed("x1", "a", "t", 0.1, 201)}, "a"},
			{"cpu limit", []*store.Sandbox{placed("x2", "a", "t", 0.6, 10)}, "a"},
			{"all or nothing", []*store.Sandbox{placed("x3", "b", "t", 1, 10), placed("x4", "a", "t", 1, 500)}, "a"},
			{"unknown node", []*store.Sandbox{placed("x5", "ghost", "t", 1, 10)}, "ghost"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := s.PlaceSandboxes(ctx, tc.sbs)
				var pe *store.PlaceError
				if !errors.Is(err, store.ErrNodeFull) || !errors.Is(err, errdefs.ErrResourceExhausted) || !errors.As(err, &pe) || pe.Node != tc.node {
					t.Fatalf("PlaceSandboxes = %v; want ErrNodeFull on %s", err, tc.node)
				}
				for _, sb := range tc.sbs {
					if _, err := s.GetSandbox(ctx, sb.API.ID); !errors.Is(err, errdefs.ErrNotFound) {
						t.Fatalf("refused sandbox %s was written: %v", sb.API.ID, err)
					}
				}
			})
		}
		if b := mustNode(t, s, "b"); b.Allocated.MemoryMB != 0 || b.Sandboxes != 0 {
			t.Fatalf("refused batch charged node b: %+v", b)
		}
		if err := s.PlaceSandboxes(ctx, []*store.Sandbox{placed("s1", "b", "t", 1, 1)}); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("placing an existing id: %v", err)
		}
		if b := mustNode(t, s, "b"); b.Sandboxes != 0 {
			t.Fatalf("duplicate id charged node b: %+v", b)
		}

		// Down and draining nodes take nothing.
		if err := s.SetNodeDrain(ctx, "b", true); err != nil {
			t.Fatal(err)
		}
		if err := s.PlaceSandboxes(ctx, []*store.Sandbox{placed("x6", "b", "t", 1, 1)}); !errors.Is(err, store.ErrNodeFull) {
			t.Fatalf("draining node: %v", err)
		}
		s.SetNodeDrain(ctx, "b", false)
		if _, err := s.SetNodeState(ctx, "b", []string{store.NodeUp}, store.NodeDown, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := s.PlaceSandboxes(ctx, []*store.Sandbox{placed("x7", "b", "t", 1, 1)}); !errors.Is(err, store.ErrNodeFull) {
			t.Fatalf("down node: %v", err)
		}
		s.SetNodeState(ctx, "b", []string{store.NodeDown}, store.NodeUp, time.Time{})

		// Ending a record releases its charge, once.
		sb, err := s.GetSandbox(ctx, "s1")
		if err != nil || sb.API.State != api.StateCreating {
			t.Fatalf("GetSandbox = %+v, %v", sb, err)
		}
		sb.API.State = api.StateRunning
		if err := s.UpdateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		if a := mustNode(t, s, "a"); a.Allocated.MemoryMB != 800 {
			t.Fatalf("an update that ends nothing released: %+v", a)
		}
		now := time.Now().UTC()
		sb.API.State, sb.DeletedAt = api.StateDeleted, &now
		if err := s.UpdateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		if a := mustNode(t, s, "a"); a.Allocated.MemoryMB != 400 || a.Sandboxes != 1 || a.Allocated.CPU != 0.5 {
			t.Fatalf("after deleting s1 (twice): %+v", a)
		}
		if u, err := s.Usage(ctx, "t"); err != nil || u.Sandboxes != 1 || u.MemoryMB != 400 || u.CPU != 0.5 {
			t.Fatalf("tenant usage after delete: %+v, %v", u, err)
		}
	})

	t.Run("tenant quotas", func(t *testing.T) {
		s := open(t)
		s.UpsertNode(ctx, node("a", 1000, 1<<20))
		if u, err := s.Usage(ctx, "q"); err != nil || u != (store.Usage{}) {
			t.Fatalf("usage of a new tenant: %+v, %v", u, err)
		}
		if err := s.SetQuota(ctx, "q", store.Quota{Sandboxes: 3, CPU: 2.5, MemoryMB: 1000}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			sbs  []*store.Sandbox
			ok   bool
		}{
			{"within", []*store.Sandbox{placed("q1", "a", "q", 1, 300), placed("q2", "a", "q", 1, 300)}, true},
			{"cpu over", []*store.Sandbox{placed("q3", "a", "q", 0.6, 10)}, false},
			{"memory over", []*store.Sandbox{placed("q4", "a", "q", 0.1, 401)}, false},
			{"last one fits", []*store.Sandbox{placed("q5", "a", "q", 0.5, 400)}, true},
			{"count over", []*store.Sandbox{placed("q6", "a", "q", 0, 16)}, false},
			{"other tenants unaffected", []*store.Sandbox{placed("q7", "a", "other", 10, 10000)}, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := s.PlaceSandboxes(ctx, tc.sbs)
				if tc.ok && err != nil {
					t.Fatal(err)
				}
				var pe *store.PlaceError
				if !tc.ok && (!errors.Is(err, store.ErrQuotaExceeded) || !errors.As(err, &pe) || pe.Tenant != "q") {
					t.Fatalf("PlaceSandboxes = %v; want ErrQuotaExceeded", err)
				}
			})
		}
		u, err := s.Usage(ctx, "q")
		if err != nil || u.Sandboxes != 3 || u.CPU != 2.5 || u.MemoryMB != 1000 || u.Quota.Sandboxes != 3 || u.Quota.CPU != 2.5 {
			t.Fatalf("usage = %+v, %v", u, err)
		}
		if err := s.SetQuota(ctx, "q", store.Quota{}); err != nil {
			t.Fatal(err)
		}
		if err := s.PlaceSandboxes(ctx, []*store.Sandbox{placed("q8", "a", "q", 5, 5000)}); err != nil {
			t.Fatalf("after lifting the quota: %v", err)
		}
	})

	t.Run("move and lost", func(t *testing.T) {
		s := open(t)
		s.UpsertNode(ctx, node("a", 10, 1000))
		s.UpsertNode(ctx, node("b", 10, 500))
		sb := placed("m1", "a", "t", 1, 400)
		if err := s.PlaceSandboxes(ctx, []*store.Sandbox{sb}); err != nil {
			t.Fatal(err)
		}
		if err := s.MoveSandbox(ctx, sb, "b"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetSandbox(ctx, "m1"); got.API.Node != "b" || got.Version != sb.Version || sb.API.Node != "b" {
			t.Fatalf("after move: stored %+v, held %+v", got.API, sb.API)
		}
		if a, b := mustNode(t, s, "a"), mustNode(t, s, "b"); a.Sandboxes != 0 || a.Allocated.MemoryMB != 0 || b.Allocated.MemoryMB != 400 {
			t.Fatalf("charges after move: a %+v b %+v", a.Allocated, b.Allocated)
		}
		// A move is no new charge to the tenant: it goes through with the
		// tenant's quota lowered below what it uses, and leaves its usage
		// as it was.
		if err := s.SetQuota(ctx, "t", store.Quota{MemoryMB: 100}); err != nil {
			t.Fatal(err)
		}
		if err := s.MoveSandbox(ctx, sb, "a"); err != nil {
			t.Fatalf("move with the quota below usage: %v", err)
		}
		if u, err := s.Usage(ctx, "t"); err != nil || u.Sandboxes != 1 || u.MemoryMB != 400 || u.CPU != 1 {
			t.Fatalf("tenant usage after a move: %+v, %v", u, err)
		}
		if err := s.MoveSandbox(ctx, sb, "b"); err != nil {
			t.Fatal(err)
		}
		if err := s.SetQuota(ctx, "t", store.Quota{}); err != nil {
			t.Fatal(err)
		}
		if a, b := mustNode(t, s, "a"), mustNode(t, s, "b"); a.Sandboxes != 0 || a.Allocated.MemoryMB != 0 || b.Sandboxes != 1 || b.Allocated.MemoryMB != 400 {
			t.Fatalf("charges after moving back: a %+v b %+v", a.Allocated, b.Allocated)
		}
		big := placed("m2", "a", "t", 1, 200)
		s.PlaceSandboxes(ctx, []*store.Sandbox{big})
		if err := s.MoveSandbox(ctx, big, "b"); !errors.Is(err, store.ErrNodeFull) {
			t.Fatalf("move onto a full node: %v", err)
		}
		if got, _ := s.GetSandbox(ctx, "m2"); got.API.Node != "a" || mustNode(t, s, "a").Allocated.MemoryMB != 200 {
			t.Fatalf("a refused move changed the record: %+v", got.API)
		}

		n, err := s.MarkSandboxesLost(ctx, "b")
		if err != nil || n != 1 {
			t.Fatalf("MarkSandboxesLost = %d, %v", n, err)
		}
		lost, err := s.GetSandbox(ctx, "m1")
		if err != nil || lost.API.State != api.StateLost || lost.Version != sb.Version+1 {
			t.Fatalf("lost sandbox: %+v, %v", lost, err)
		}
		if err := s.UpdateSandbox(ctx, sb); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("update from before the loss: %v", err)
		}
		if b := mustNode(t, s, "b"); b.Allocated.MemoryMB != 400 {
			t.Fatalf("lost sandboxes must stay charged: %+v", b.Allocated)
		}
		list, _, err := s.ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, States: []string{api.StateLost}})
		if err != nil || len(list) != 1 || list[0].API.ID != "m1" {
			t.Fatalf("list lost: %+v, %v", list, err)
		}
		if n, _ := s.MarkSandboxesLost(ctx, "b"); n != 0 {
			t.Fatalf("second MarkSandboxesLost = %d", n)
		}
	})

	t.Run("concurrent placements never overcommit", func(t *testing.T) {
		s := open(t)
		s.UpsertNode(ctx, node("a", 1000, 1000))
		checkConcurrent(t, []store.Store{s}, "a")
	})

	t.Run("concurrent placements never overcommit disk", func(t *testing.T) {
		s := open(t)
		n := node("d", 1000, 1<<20)
		n.Capacity.DiskMB, n.Limit.DiskMB = 1000, 1000
		if err := s.UpsertNode(ctx, n); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []*store.Sandbox
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb := placed(fmt.Sprintf("d%02d", i), "d", "t", 0.1, 10)
				sb.API.Resources.DiskMB = 100
				err := s.PlaceSandboxes(ctx, []*store.Sandbox{sb})
				switch {
				case err == nil:
					mu.Lock()
					won = append(won, sb)
					mu.Unlock()
				case !errors.Is(err, store.ErrNodeFull):
					t.Errorf("place %s: %v", sb.API.ID, err)
				}
			}()
		}
		wg.Wait()
		got := mustNode(t, s, "d")
		if len(won) != 10 || got.Sandboxes != 10 || got.Allocated.DiskMB != 1000 || got.Limit.DiskMB != 1000 {
			t.Fatalf("%d placements of 100 MB disk succeeded on a 1000 MB disk; node holds %d sandboxes, %d MB allocated (limit %d); want 10, 10, 1000",
				len(won), got.Sandboxes, got.Allocated.DiskMB, got.Limit.DiskMB)
		}
		// A batch that would pass the limit is refused whole; a record
		// that ends returns its disk; a move carries it.
		more := []*store.Sandbox{placed("e0", "d", "t", 0.1, 10)}
		more[0].API.Resources.DiskMB = 100
		if err := s.PlaceSandboxes(ctx, more); !errors.Is(err, store.ErrNodeFull) {
			t.Fatalf("place past the disk limit: %v", err)
		}
		end := won[0]
		now := time.Now().UTC()
		end.API.State, end.DeletedAt = api.StateDeleted, &now
		if err := s.UpdateSandbox(ctx, end); err != nil {
			t.Fatal(err)
		}
		if got := mustNode(t, s, "d"); got.Allocated.DiskMB != 900 {
			t.Fatalf("after a delete: %d MB disk allocated, want 900", got.Allocated.DiskMB)
		}
		other := node("o", 1000, 1<<20)
		other.Capacity.DiskMB, other.Limit.DiskMB = 150, 150
		s.UpsertNode(ctx, other)
		if err := s.MoveSandbox(ctx, won[1], "o"); err != nil {
			t.Fatal(err)
		}
		if err := s.MoveSandbox(ctx, won[2], "o"); !errors.Is(err, store.ErrNodeFull) {
			t.Fatalf("move onto a full disk: %v", err)
		}
		if d, o := mustNode(t, s, "d"), mustNode(t, s, "o"); d.Allocated.DiskMB != 800 || o.Allocated.DiskMB != 100 {
			t.Fatalf("after a move: %d and %d MB disk allocated, want 800 and 100", d.Allocated.DiskMB, o.Allocated.DiskMB)
		}
	})
}

// checkConcurrent places 64 sandboxes of 100 MB on a 1000 MB node from
// several goroutines spread over the stores (handles on one database) and
// checks exactly 10 fit and the charge matches the records.
func checkConcurrent(t *testing.T, stores []store.Store, nodeID string) {
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i%len(stores)]
			err := s.PlaceSandboxes(ctx, []*store.Sandbox{placed(fmt.Sprintf("c%02d", i), nodeID, "t", 0.1, 100)})
			switch {
			case err == nil:
				mu.Lock()
				ok++
				mu.Unlock()
			case !errors.Is(err, store.ErrNodeFull):
				t.Errorf("place c%02d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	n := mustNode(t, stores[0], nodeID)
	list, _, err := stores[0].ListSandboxes(ctx, store.SandboxFilter{AllTenants: true, Node: nodeID})
	if err != nil {
		t.Fatal(err)
	}
	if ok != 10 || n.Sandboxes != 10 || n.Allocated.MemoryMB != 1000 || len(list) != 10 {
		t.Fatalf("%d placements succeeded, node holds %d (%d MB), %d records; want 10 of each", ok, n.Sandboxes, n.Allocated.MemoryMB, len(list))
	}
}

// RunReplicas checks what several control-plane replicas need of a store:
// open returns handles on one fresh database, as separate processes would
// hold them. Concurrent placements through different handles never
// overcommit, and one sandbox id is placed once.
func RunReplicas(t *testing.T, open func(t *testing.T, n int) []store.Store) {
	ctx := context.Background()
	t.Run("replicas never overcommit a node", func(t *testing.T) {
		ss := open(t, 3)
		if err := ss[0].UpsertNode(ctx, node("r", 1000, 1000)); err != nil {
			t.Fatal(err)
		}
		checkConcurrent(t, ss, "r")
	})
	t.Run("replicas place one id once", func(t *testing.T) {
		ss := open(t, 2)
		ss[0].UpsertNode(ctx, node("r", 1000, 1<<20))
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = ss[i%2].PlaceSandboxes(ctx, []*store.Sandbox{placed("same", "r", "t", 1, 100)})
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, errdefs.ErrAlreadyExists):
				t.Errorf("unexpected error: %v", err)
			}
		}
		if n := mustNode(t, ss[1], "r"); won != 1 || n.Sandboxes != 1 || n.Allocated.MemoryMB != 100 {
			t.Fatalf("%d placements of one id won; node holds %d sandboxes", won, n.Sandboxes)
		}
	})
}
