package scheduler

import (
	"errors"
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
