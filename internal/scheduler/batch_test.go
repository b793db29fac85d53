package scheduler

import (
	"errors"
	"testing"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

func TestReserveMany(t *testing.T) {
	c := []string{api.BackendContainer}
	req := Request{Backend: api.BackendContainer, Resources: api.Resources{CPU: 0.5, MemoryMB: 100}}
	for _, tc := range []struct {
		name       string
		capacities map[string]int64 // node → memory MB
		n          int
		wantPlaced int
		wantPer    map[string]int
	}{
		{"all fit on one node", map[string]int64{"a": 10000}, 50, 50, map[string]int{"a": 50}},
		{"partial: memory is the limit", map[string]int64{"a": 1000}, 25, 10, map[string]int{"a": 10}},
		{"spread over equal nodes", map[string]int64{"a": 2000, "b": 2000}, 20, 20, map[string]int{"a": 10, "b": 10}},
		{"more to the bigger node", map[string]int64{"a": 1000, "b": 3000}, 40, 40, map[string]int{"a": 10, "b": 30}},
		{"no nodes", map[string]int64{}, 3, 0, map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(DefaultConfig)
			for id, mem := range tc.capacities {
				s.SetNode(NodeState{ID: id, State: NodeUp, Capacity: api.Resources{CPU: 64, MemoryMB: mem}, Backends: c})
			}
			got, err := s.ReserveMany(req, tc.n)
			if len(got) != tc.wantPlaced {
				t.Fatalf("placed %d, want %d (err %v)", len(got), tc.wantPlaced, err)
			}
			if (len(got) < tc.n) != errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("err = %v with %d of %d placed", err, len(got), tc.n)
			}
			per := map[string]int{}
			for _, id := range got {
				per[id]++
			}
			for id, want := range tc.wantPer {
				if per[id] != want {
					t.Fatalf("node %s got %d, want %d (all: %v)", id, per[id], want, per)
				}
			}
			for _, n := range s.Nodes() {
				if n.Sandboxes != per[n.ID] || n.Allocated.MemoryMB != int64(per[n.ID])*100 || n.Allocated.MemoryMB > n.Capacity.MemoryMB {
					t.Fatalf("node %s state %+v after placing %d", n.ID, n, per[n.ID])
				}
			}
		})
	}
}
