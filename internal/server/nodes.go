package server

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/store"
)

// registry holds a client for every node the control plane knows.
type registry struct {
	mu    sync.Mutex
	nodes map[string]*node
}

type node struct {
	id     string
	addr   string
	client *edge.Client
	info   edge.NodeInfo
}

func newRegistry() *registry { return &registry{nodes: map[string]*node{}} }

func (r *registry) put(n *node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes[n.id] = n
}

func (r *registry) get(id string) (*node, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return nil, fmt.Errorf("node %s is not connected: %w", id, errdefs.ErrUnavailable)
	}
	return n, nil
}

func (r *registry) list() []*node {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*node, 0, len(r.nodes))
	for _, n := range r.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *node) int { return cmpString(a.id, b.id) })
	return out
}

// backends is every backend some node offers.
func (r *registry) backends() map[string]bool {
	out := map[string]bool{}
	for _, n := range r.list() {
		for _, b := range n.info.Backends {
			out[b] = true
		}
	}
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// AddNode connects the control plane to the edge at addr, records the node,
// and reconciles the sandboxes the control plane believes are on it with
// those it really runs.
func (s *Server) AddNode(ctx context.Context, addr, token string) error {
	c, err := edge.NewClient(addr, token)
	if err != nil {
		return err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("add node %s: %w", addr, err)
	}
	now := time.Now().UTC()
	if err := s.store.UpsertNode(ctx, store.Node{
		ID: info.ID, Addr: addr, State: scheduler.NodeUp, Capacity: info.Capacity,
		Backends: info.Backends, LastSeen: now, CreatedAt: now,
	}); err != nil {
		return err
	}
	s.nodes.put(&node{id: info.ID, addr: addr, client: c, info: info})
	s.sched.SetNode(scheduler.NodeState{
		ID: info.ID, State: scheduler.NodeUp, Capacity: info.Capacity, Backends: info.Backends,
	})
	return s.reconcile(ctx, info.ID, c)
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	stored, err := s.store.ListNodes(r.Context())
	if err != nil {
		return err
	}
	states := map[string]scheduler.NodeState{}
	for _, n := range s.sched.Nodes() {
		states[n.ID] = n
	}
	out := api.NodeList{Nodes: []api.Node{}}
	for _, n := range stored {
		st := states[n.ID]
		state := n.State
		if _, err := s.nodes.get(n.ID); err != nil {
			state = scheduler.NodeDown
		}
		out.Nodes = append(out.Nodes, api.Node{
			ID: n.ID, Addr: n.Addr, State: state, Capacity: n.Capacity, Allocated: st.Allocated,
			Sandboxes: st.Sandboxes, Backends: n.Backends, LastSeen: n.LastSeen,
		})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
