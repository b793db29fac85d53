package scheduler

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

func TestPlace(t *testing.T) {
	c := []string{api.BackendContainer}
	big := api.Resources{CPU: 2, MemoryMB: 4096}
	for _, tc := range []struct {
		name  string
		nodes []NodeState
		req   api.Resources
		want  string
	}{
		{"least loaded wins", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Allocated: api.Resources{MemoryMB: 3000}, Backends: c},
			{ID: "b", State: NodeUp, Capacity: big, Allocated: api.Resources{MemoryMB: 1000}, Backends: c},
		}, api.Resources{CPU: 1, MemoryMB: 512}, "b"},
		{"memory is a hard limit", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Allocated: api.Resources{MemoryMB: 3800}, Backends: c},
		}, api.Resources{CPU: 1, MemoryMB: 512}, ""},
		{"cpu overcommitted 50x", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Allocated: api.Resources{CPU: 99}, Backends: c},
		}, api.Resources{CPU: 1, MemoryMB: 1}, "a"},
		{"cpu beyond overcommit", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Allocated: api.Resources{CPU: 99.5}, Backends: c},
		}, api.Resources{CPU: 1, MemoryMB: 1}, ""},
		{"down and draining nodes are skipped", []NodeState{
			{ID: "a", State: NodeDown, Capacity: big, Backends: c},
			{ID: "b", State: NodeDraining, Capacity: big, Backends: c},
		}, api.Resources{CPU: 1, MemoryMB: 1}, ""},
		{"backend must be offered", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Backends: []string{api.BackendMicroVM}},
		}, api.Resources{CPU: 1, MemoryMB: 1}, ""},
		{"sandboxes measured over 90% of the cores: nothing new", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: api.NodeLoad{CPU: 1.9, SandboxCPU: 1.85}, Backends: c},
		}, api.Resources{CPU: 0.1, MemoryMB: 1}, ""},
		{"a busy host alone does not refuse", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: api.NodeLoad{CPU: 2}, Backends: c},
		}, api.Resources{CPU: 0.1, MemoryMB: 1}, "a"},
		{"sandboxes' measured memory counts", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: api.NodeLoad{SandboxMemoryMB: 3900}, Backends: c},
		}, api.Resources{CPU: 0.1, MemoryMB: 512}, ""},
		{"a host using more than the node offers does not refuse", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: api.NodeLoad{MemoryMB: 20000}, Backends: c},
		}, api.Resources{CPU: 0.1, MemoryMB: 512}, "a"},
		{"measured cpu steers to the idle node", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: api.NodeLoad{CPU: 1.5}, Backends: c},
			{ID: "b", State: NodeUp, Capacity: big, Allocated: api.Resources{MemoryMB: 1000}, Backends: c},
		}, api.Resources{CPU: 0.1, MemoryMB: 1}, "b"},
		{"pids limit", []NodeState{
			{ID: "a", State: NodeUp, Capacity: api.Resources{CPU: 2, MemoryMB: 4096, Pids: 100}, Allocated: api.Resources{Pids: 90}, Backends: c},
		}, api.Resources{CPU: 0.1, MemoryMB: 1, Pids: 20}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(tc.nodes, Request{Backend: api.BackendContainer, Resources: tc.req}, DefaultConfig)
			if tc.want == "" {
				if !errors.Is(err, errdefs.ErrResourceExhausted) {
					t.Fatalf("Place = %q, %v; want ErrResourceExhausted", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Place = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestReserveNeverOvercommits(t *testing.T) {
	s := New(DefaultConfig)
	s.SetNode(NodeState{ID: "a", State: NodeUp, Capacity: api.Resources{CPU: 2, MemoryMB: 1000}, Backends: []string{api.BackendContainer}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Reserve(Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 0.1, MemoryMB: 100}}); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != 10 {
		t.Fatalf("%d reservations of 100 MB fit in 1000 MB, want 10", ok)
	}
	s.Release("a", api.Resources{CPU: 0.1, MemoryMB: 100})
	if _, err := s.Reserve(Request{Backend: api.BackendContainer, Resources: api.Resources{MemoryMB: 100}}); err != nil {
		t.Fatalf("reserve after release: %v", err)
	}
	if n := s.Nodes()[0]; n.Sandboxes != 10 || n.Allocated.MemoryMB != 1000 {
		t.Fatalf("node state after release+reserve: %+v", n)
	}
}

func TestAffinityAndBurst(t *testing.T) {
	c := []string{api.BackendContainer}
	capa := api.Resources{CPU: 10, MemoryMB: 10000}
	small := api.Resources{CPU: 1, MemoryMB: 100}
	cached := map[string]bool{"sha256:base": true, "sha256:ws": true}
	at := func(id string, memUsed int64, pool string, layers map[string]bool) NodeState {
		return NodeState{ID: id, State: NodeUp, Pool: pool, Capacity: capa, Backends: c,
			Allocated: api.Resources{MemoryMB: memUsed}, Layers: layers}
	}
	for _, tc := range []struct {
		name  string
		nodes []NodeState
		req   Request
		want  string
	}{
		{"cached layers win among equals",
			[]NodeState{at("a", 2000, "", nil), at("b", 2000, "", cached)},
			Request{Layers: []string{"sha256:base", "sha256:ws"}}, "b"},
		{"cached layers win over slightly emptier",
			[]NodeState{at("a", 1000, "", nil), at("b", 2000, "", cached)},
			Request{Layers: []string{"sha256:base", "sha256:ws"}}, "b"},
		{"a much emptier node beats the cache",
			[]NodeState{at("a", 0, "", nil), at("b", 6000, "", cached)},
			Request{Layers: []string{"sha256:base", "sha256:ws"}}, "a"},
		{"burst unused below the threshold",
			[]NodeState{at("a", 7000, "", nil), at("cloud", 0, PoolBurst, nil)},
			Request{Burst: true}, "a"},
		{"burst used above the threshold",
			[]NodeState{at("a", 8500, "", nil), at("cloud", 0, PoolBurst, nil)},
			Request{Burst: true}, "cloud"},
		{"burst never used without consent",
			[]NodeState{at("a", 9500, "", nil), at("cloud", 0, PoolBurst, nil)},
			Request{}, "a"},
		{"excluded node skipped",
			[]NodeState{at("a", 0, "", nil), at("b", 5000, "", nil)},
			Request{Exclude: []string{"a"}}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Backend, tc.req.Resources = api.BackendContainer, small
			got, err := Place(tc.nodes, tc.req, DefaultConfig)
			if err != nil || got != tc.want {
				t.Fatalf("Place = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("no regular room and no consent: exhausted", func(t *testing.T) {
		_, err := Place([]NodeState{at("a", 10000, "", nil), at("cloud", 0, PoolBurst, nil)},
			Request{Backend: api.BackendContainer, Resources: small}, DefaultConfig)
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestPlaceBatchSpreads(t *testing.T) {
	c := []string{api.BackendContainer}
	capa := api.Resources{CPU: 64, MemoryMB: 1 << 20}
	nodes := []NodeState{
		{ID: "a", State: NodeUp, Capacity: capa, Backends: c},
		{ID: "b", State: NodeUp, Capacity: capa, Backends: c, Layers: map[string]bool{"sha256:x": true}},
		{ID: "c", State: NodeUp, Capacity: capa, Backends: c},
		{ID: "d", State: NodeUp, Capacity: capa, Backends: c},
	}
	req := Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 1, MemoryMB: 100}, Layers: []string{"sha256:x"}}
	t.Run("every node gets a share, the cached one the most", func(t *testing.T) {
		ids, err := PlaceBatch(nodes, req, 400, DefaultConfig)
		if err != nil || len(ids) != 400 {
			t.Fatalf("PlaceBatch = %d, %v", len(ids), err)
		}
		per := map[string]int{}
		for _, id := range ids {
			per[id]++
		}
		for _, n := range nodes {
			if per[n.ID] < 60 {
				t.Errorf("node %s got %d of 400: not spread (%v)", n.ID, per[n.ID], per)
			}
			if n.ID != "b" && per[n.ID] > per["b"] {
				t.Errorf("node %s got more than the cached node: %v", n.ID, per)
			}
		}
		if nodes[0].Allocated.CPU != 0 {
			t.Fatal("PlaceBatch modified its input")
		}
	})
	t.Run("cpu overcommit bounds the batch", func(t *testing.T) {
		// 4 nodes × 64 cores × 50 = 12800 cores of 1-core sandboxes.
		ids, err := PlaceBatch(nodes, req, 13000, DefaultConfig)
		if err != nil || len(ids) != 12800 {
			t.Fatalf("PlaceBatch = %d, %v; want 12800", len(ids), err)
		}
	})
	t.Run("batch overflows to burst past the threshold", func(t *testing.T) {
		two := []NodeState{
			{ID: "a", State: NodeUp, Capacity: api.Resources{CPU: 100, MemoryMB: 1000}, Backends: c},
			{ID: "cloud", State: NodeUp, Pool: PoolBurst, Capacity: api.Resources{CPU: 100, MemoryMB: 1000}, Backends: c},
		}
		r := Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 0.1, MemoryMB: 100}, Burst: true}
		ids, err := PlaceBatch(two, r, 12, DefaultConfig)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"a", "a", "a", "a", "a", "a", "a", "a", "cloud", "cloud", "cloud", "cloud"}
		if !slices.Equal(ids, want) {
			t.Fatalf("PlaceBatch = %v, want %v", ids, want)
		}
	})
}

func TestBusyIsTellable(t *testing.T) {
	c := []string{api.BackendContainer}
	big := api.Resources{CPU: 2, MemoryMB: 4096}
	busy := api.NodeLoad{CPU: 2, SandboxCPU: 1.9}
	for _, tc := range []struct {
		name     string
		nodes    []NodeState
		req      Request
		wantBusy bool
	}{
		{"room but busy", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: busy, Backends: c},
		}, Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 1, MemoryMB: 512}}, true},
		{"busy and also out of memory", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Allocated: api.Resources{MemoryMB: 4000}, Load: busy, Backends: c},
		}, Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 1, MemoryMB: 512}}, false},
		{"a busy node plus a full one", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: busy, Backends: c},
			{ID: "b", State: NodeUp, Capacity: big, Allocated: api.Resources{MemoryMB: 4000}, Backends: c},
		}, Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 1, MemoryMB: 512}}, true},
		{"only an excluded node is busy", []NodeState{
			{ID: "a", State: NodeUp, Capacity: big, Load: busy, Backends: c},
		}, Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 1, MemoryMB: 512}, Exclude: []string{"a"}}, false},
		{"a busy burst node does not count without burst", []NodeState{
			{ID: "a", State: NodeUp, Pool: PoolBurst, Capacity: big, Load: busy, Backends: c},
		}, Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 1, MemoryMB: 512}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Place(tc.nodes, tc.req, DefaultConfig)
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("Place: %v; want ErrResourceExhausted", err)
			}
			if got := errors.Is(err, ErrBusy); got != tc.wantBusy {
				t.Fatalf("Place: %v; busy = %v, want %v", err, got, tc.wantBusy)
			}
		})
	}
	if !Busy(NodeState{Capacity: big, Load: busy}, Config{}) || Busy(NodeState{Capacity: big, Load: api.NodeLoad{CPU: 2, SandboxCPU: 1}}, Config{}) {
		t.Fatal("Busy: want true at 95% of the cores in sandboxes, false at 50%")
	}
}

func TestPlaceDisk(t *testing.T) {
	c := []string{api.BackendContainer}
	withDisk := api.Resources{CPU: 2, MemoryMB: 4096, DiskMB: 10000}
	req := api.Resources{CPU: 0.1, MemoryMB: 16, DiskMB: 4000}
	hard := DefaultConfig
	hard.DiskOvercommit = 1
	for _, tc := range []struct {
		name  string
		nodes []NodeState
		cfg   Config
		want  string
	}{
		{"disk is hard like memory", []NodeState{
			{ID: "a", State: NodeUp, Capacity: withDisk, Allocated: api.Resources{DiskMB: 7000}, Backends: c},
		}, hard, ""},
		{"disk that fits exactly", []NodeState{
			{ID: "a", State: NodeUp, Capacity: withDisk, Allocated: api.Resources{DiskMB: 6000}, Backends: c},
		}, hard, "a"},
		{"an explicit disk overcommit", []NodeState{
			{ID: "a", State: NodeUp, Capacity: withDisk, Allocated: api.Resources{DiskMB: 15000}, Backends: c},
		}, Config{DiskOvercommit: 2}, "a"},
		{"a disk full to its reserve takes nothing, whatever is allocated", []NodeState{
			{ID: "a", State: NodeUp, Capacity: withDisk, Load: api.NodeLoad{DiskUsedMB: 9500, DiskFull: true}, Backends: c},
		}, Config{DiskOvercommit: 100}, ""},
		{"the emptier disk wins when memory and cpu are equal", []NodeState{
			{ID: "a", State: NodeUp, Capacity: withDisk, Allocated: api.Resources{DiskMB: 5000}, Backends: c},
			{ID: "b", State: NodeUp, Capacity: withDisk, Allocated: api.Resources{DiskMB: 1000}, Backends: c},
		}, hard, "b"},
		{"a node that reports no disk is not limited by it", []NodeState{
			{ID: "a", State: NodeUp, Capacity: api.Resources{CPU: 2, MemoryMB: 4096}, Allocated: api.Resources{DiskMB: 1 << 30}, Backends: c},
		}, hard, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(tc.nodes, Request{Backend: api.BackendContainer, Resources: req}, tc.cfg)
			if tc.want == "" {
				if !errors.Is(err, errdefs.ErrResourceExhausted) || errors.Is(err, ErrBusy) ||
					!strings.Contains(err.Error(), "4000 MB disk") {
					t.Fatalf("Place = %q, %v; want ErrResourceExhausted naming the disk, not busy", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Place = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestReserveNeverOvercommitsDisk(t *testing.T) {
	hard := DefaultConfig
	hard.DiskOvercommit = 1
	s := New(hard)
	s.SetNode(NodeState{ID: "a", State: NodeUp, Capacity: api.Resources{CPU: 2, MemoryMB: 1 << 20, DiskMB: 10240},
		Backends: []string{api.BackendContainer}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Reserve(Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 0.01, MemoryMB: 1, DiskMB: 1024}}); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if n := s.Nodes()[0]; ok != 10 || n.Allocated.DiskMB != 10240 {
		t.Fatalf("%d reservations of 1024 MB on a 10240 MB disk (allocated %d); want 10", ok, n.Allocated.DiskMB)
	}
}
