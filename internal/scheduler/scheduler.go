// Package scheduler decides which node runs a sandbox. Place is a pure
// function over a snapshot of node states; Scheduler keeps those states in
// memory, reserving resources atomically so that concurrent creates never
// overcommit a node. It must never talk to nodes or the database: callers
// feed it what they learn and persist what it decides.
package scheduler

import (
	"fmt"
	"slices"
	"sync"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Node states.
const (
	NodeUp       = "up"
	NodeDown     = "down"
	NodeDraining = "draining"
)

// Config tunes placement.
type Config struct {
	// CPUOvercommit is how many times a node's cores may be promised to
	// sandboxes. Memory is never overcommitted.
	CPUOvercommit float64
}

// DefaultConfig is DSec's observation: ~90% of sandboxes use under 5% of
// the CPU they ask for, so CPU is oversubscribed 50×; memory is not.
var DefaultConfig = Config{CPUOvercommit: 50}

// NodeState is what the scheduler knows of a node.
type NodeState struct {
	ID        string
	State     string
	Capacity  api.Resources
	Allocated api.Resources
	Sandboxes int
	Backends  []string
}

// Request is what a sandbox needs.
type Request struct {
	Backend   string
	Resources api.Resources
}

// Place picks the node for req: among the nodes that are up, run the
// backend and have room (memory hard, CPU against capacity × overcommit),
// the one with the most free memory relative to its size.
func Place(nodes []NodeState, req Request, cfg Config) (string, error) {
	best, bestScore := "", -1.0
	for _, n := range nodes {
		if !fits(n, req, cfg) {
			continue
		}
		score := 1 - float64(n.Allocated.MemoryMB+req.Resources.MemoryMB)/float64(n.Capacity.MemoryMB)
		if score > bestScore {
			best, bestScore = n.ID, score
		}
	}
	if best == "" {
		return "", fmt.Errorf("no node has room for a %s sandbox with %g cpu and %d MB: %w",
			req.Backend, req.Resources.CPU, req.Resources.MemoryMB, errdefs.ErrResourceExhausted)
	}
	return best, nil
}

func fits(n NodeState, req Request, cfg Config) bool {
	if n.State != NodeUp || !slices.Contains(n.Backends, req.Backend) {
		return false
	}
	if n.Allocated.MemoryMB+req.Resources.MemoryMB > n.Capacity.MemoryMB {
		return false
	}
	if n.Capacity.Pids > 0 && n.Allocated.Pids+req.Resources.Pids > n.Capacity.Pids {
		return false
	}
	return n.Allocated.CPU+req.Resources.CPU <= n.Capacity.CPU*cfg.CPUOvercommit
}

// Scheduler holds node states and reserves resources on them.
type Scheduler struct {
	cfg Config

	mu    sync.Mutex
	nodes map[string]*NodeState
}

// New returns an empty scheduler.
func New(cfg Config) *Scheduler {
	if cfg.CPUOvercommit <= 0 {
		cfg.CPUOvercommit = DefaultConfig.CPUOvercommit
	}
	return &Scheduler{cfg: cfg, nodes: map[string]*NodeState{}}
}

// SetNode adds a node or updates its state, capacity and backends, keeping
// what is allocated on it.
func (s *Scheduler) SetNode(n NodeState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.nodes[n.ID]; ok {
		cur.State, cur.Capacity, cur.Backends = n.State, n.Capacity, n.Backends
		return
	}
	cp := n
	s.nodes[n.ID] = &cp
}

// Reserve places req and books its resources on the chosen node.
func (s *Scheduler) Reserve(req Request) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := make([]NodeState, 0, len(s.nodes))
	for _, n := range s.nodes {
		snap = append(snap, *n)
	}
	id, err := Place(snap, req, s.cfg)
	if err != nil {
		return "", err
	}
	s.add(id, req.Resources, 1)
	return id, nil
}

// Charge books resources on a given node without placement: for sandboxes
// that already exist when the control plane starts.
func (s *Scheduler) Charge(node string, r api.Resources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(node, r, 1)
}

// Release returns a sandbox's resources to its node.
func (s *Scheduler) Release(node string, r api.Resources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(node, r, -1)
}

// Preconditions: s.mu is held.
func (s *Scheduler) add(node string, r api.Resources, sign int) {
	n, ok := s.nodes[node]
	if !ok {
		n = &NodeState{ID: node, State: NodeDown}
		s.nodes[node] = n
	}
	f := float64(sign)
	n.Allocated.CPU += f * r.CPU
	n.Allocated.MemoryMB += int64(sign) * r.MemoryMB
	n.Allocated.DiskMB += int64(sign) * r.DiskMB
	n.Allocated.Pids += int64(sign) * r.Pids
	n.Sandboxes += sign
}

// Nodes returns a snapshot of every node's state.
func (s *Scheduler) Nodes() []NodeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]NodeState, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, *n)
	}
	slices.SortFunc(out, func(a, b NodeState) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}
