package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
	"github.com/dsec-project/dsec/internal/scheduler"
	"github.com/dsec-project/dsec/internal/store"
)

// registry holds this replica's client for every node it knows.
type registry struct {
	mu       sync.Mutex
	nodes    map[string]*node
	backends map[string]bool // every backend some known node offers
}

// node is the connection to one node's edge. Its ctx ends when the node is
// declared down or its address changes, which cuts the calls in flight to
// it short.
type node struct {
	id, addr, token string
	client          *edge.Client
	ctx             context.Context
	cancel          context.CancelFunc
}

func newRegistry() *registry {
	return &registry{nodes: map[string]*node{}, backends: map[string]bool{}}
}

// put records n, replacing (and cutting off) a previous connection.
func (r *registry) put(n *node, backends []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.nodes[n.id]; ok && old != n {
		old.cancel()
	}
	r.nodes[n.id] = n
	for _, b := range backends {
		r.backends[b] = true
	}
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

// lookup returns the connection to id, if any.
func (r *registry) lookup(id string) (*node, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	return n, ok
}

// cut ends the calls in flight to a node that went down and forgets the
// connection; the next heartbeat makes a new one.
func (r *registry) cut(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.nodes[id]; ok {
		n.cancel()
		delete(r.nodes, id)
	}
}

func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.nodes)
}

// offers reports whether some node offers a backend.
func (r *registry) offers(b string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.backends[b]
}

// connect makes a connection to a node's edge.
func (s *Server) connect(id, addr, token string) (*node, error) {
	c, err := s.cfg.NewNodeClient(addr, token)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &node{id: id, addr: addr, token: token, client: c, ctx: ctx, cancel: cancel}, nil
}

// callCtx is ctx, also ended when the node is cut off.
func (n *node) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(n.ctx, func() {
		cancel(fmt.Errorf("node %s went down: %w", n.id, errdefs.ErrUnavailable))
	})
	return ctx, func() { stop(); cancel(nil) }
}

// AddNode connects the control plane to the edge at addr as a heartbeat
// would: it asks the edge who it is, records the node, and reconciles the
// sandboxes the control plane believes are on it with those it runs. Nodes
// that join over HTTP do this themselves (POST /v1/cluster/heartbeat).
func (s *Server) AddNode(ctx context.Context, addr, token string) error {
	c, err := s.cfg.NewNodeClient(addr, token)
	if err != nil {
		return err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("add node %s: %w", addr, err)
	}
	_, err = s.beat(ctx, edge.Heartbeat{
		ID: info.ID, Addr: addr, Token: token, Capacity: info.Capacity, Backends: info.Backends,
		Sandboxes: info.Sandboxes,
	}, true)
	return err
}

// nodeAPI is the public view of a stored node.
func nodeAPI(n store.Node) api.Node {
	state := n.State
	if state == store.NodeUp && n.Drain {
		state = api.NodeDraining
	}
	return api.Node{
		ID: n.ID, Addr: n.Addr, State: state, Capacity: n.Capacity, Limit: n.Limit, Allocated: n.Allocated,
		Sandboxes: n.Sandboxes, Load: n.Load, Backends: n.Backends, Labels: n.Labels, Pool: n.Labels["pool"],
		CachedLayers: len(n.Layers), LastSeen: n.LastSeen,
	}
}

// nodeView is nodeAPI with what the scheduler makes of the node.
func (s *Server) nodeView(n store.Node) api.Node {
	v := nodeAPI(n)
	v.Busy = v.State == api.NodeUp && scheduler.Busy(schedState(n), s.sched.Config())
	return v
}

// schedState is what the scheduler needs of a stored node.
func schedState(n store.Node) scheduler.NodeState {
	state := n.State
	if state == store.NodeUp && n.Drain {
		state = scheduler.NodeDraining
	}
	layers := make(map[string]bool, len(n.Layers))
	for _, d := range n.Layers {
		layers[d] = true
	}
	return scheduler.NodeState{
		ID: n.ID, State: state, Pool: n.Labels["pool"], Capacity: n.Capacity, Allocated: n.Allocated,
		Sandboxes: n.Sandboxes, Backends: n.Backends, Load: n.Load, Layers: layers,
	}
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	stored, err := s.store.ListNodes(r.Context())
	if err != nil {
		return err
	}
	out := api.NodeList{Nodes: make([]api.Node, 0, len(stored)), Admission: s.admissionView()}
	for _, n := range stored {
		out.Nodes = append(out.Nodes, s.nodeView(n))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) error {
	n, err := s.store.GetNode(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, s.nodeView(n))
	return nil
}

// drainNode and undrainNode set a node's drain flag: a draining node keeps
// its sandboxes but takes no new ones.
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request) error {
	return s.setDrain(w, r, true)
}

func (s *Server) undrainNode(w http.ResponseWriter, r *http.Request) error {
	return s.setDrain(w, r, false)
}

func (s *Server) setDrain(w http.ResponseWriter, r *http.Request, drain bool) error {
	id := r.PathValue("id")
	if err := s.store.SetNodeDrain(r.Context(), id, drain); err != nil {
		return err
	}
	n, err := s.store.GetNode(r.Context(), id)
	if err != nil {
		return err
	}
	s.sched.SetNode(schedState(n))
	s.log.InfoContext(r.Context(), "node drain changed", "node", id, "drain", drain)
	httpapi.WriteJSON(w, http.StatusOK, s.nodeView(n))
	return nil
}
