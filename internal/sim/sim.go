// Package sim simulates nodes for the cluster benchmark and the control
// plane's tests: each simulated node is the real edge (edge.Edge, its HTTP
// API and heartbeats) over a backend that runs nothing, reached through an
// in-memory transport instead of a socket. Everything above the backend —
// the control plane, its API, scheduler and store — is the real thing.
// It must never be used to claim anything about sandboxes themselves
// (start times, density): nothing runs in them.
package sim

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/edge"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Backend is a backend.Backend that runs nothing. It serves the
// "container" backend name so that ordinary create requests reach it.
type Backend struct {
	mu        sync.Mutex
	sandboxes map[string]struct{}
	// Refuse, if set, makes Create fail with what it returns.
	Refuse func(spec backend.Spec) error
}

var _ backend.Backend = (*Backend)(nil)

// Name implements backend.Backend.
func (b *Backend) Name() string { return api.BackendContainer }

// Create implements backend.Backend.
func (b *Backend) Create(_ context.Context, spec backend.Spec) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Refuse != nil {
		if err := b.Refuse(spec); err != nil {
			return err
		}
	}
	if b.sandboxes == nil {
		b.sandboxes = map[string]struct{}{}
	}
	b.sandboxes[spec.ID] = struct{}{}
	return nil
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sandboxes, id)
	return nil
}

func (b *Backend) has(id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.sandboxes[id]; !ok {
		return errdefs.NotFound("sandbox %s", id)
	}
	return nil
}

// Reset, Pause and Resume implement backend.Backend; they change nothing.
func (b *Backend) Reset(_ context.Context, id string) error  { return b.has(id) }
func (b *Backend) Pause(_ context.Context, id string) error  { return b.has(id) }
func (b *Backend) Resume(_ context.Context, id string) error { return b.has(id) }

// Dial implements backend.Backend: a simulated sandbox has no agent.
func (b *Backend) Dial(context.Context, string) (net.Conn, error) {
	return nil, fmt.Errorf("simulated sandbox has no agent: %w", errdefs.ErrUnavailable)
}

// State implements backend.Backend.
func (b *Backend) State(_ context.Context, id string) (string, error) {
	if err := b.has(id); err != nil {
		return "", err
	}
	return api.StateRunning, nil
}

// Snapshot implements backend.Backend: a simulated sandbox has no files.
func (b *Backend) Snapshot(context.Context, string, int, func(context.Context, []string) error) error {
	return errdefs.Invalid("a simulated sandbox cannot be snapshotted")
}

// Recover implements backend.Backend: nothing survives a simulation.
func (b *Backend) Recover(context.Context) ([]backend.Spec, error) { return nil, nil }

// Count is how many sandboxes the backend holds.
func (b *Backend) Count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sandboxes)
}

// layers finds every layer: a simulated node has them all.
// layers is a node's layer source: every layer is there at once; the
// node reports as cached what it fetched and what CacheLayers put there.
type layers struct{ n *Node }

func (l layers) Fetch(_ context.Context, digest string) (backend.Layer, error) {
	l.n.CacheLayers(digest)
	return backend.Layer{Digest: digest, Path: "/sim/" + digest}, nil
}

// Cached implements edge.CachedLayers.
func (l layers) Cached() []string {
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	return slices.Collect(maps.Keys(l.n.cached))
}

// Node is one simulated node.
type Node struct {
	ID      string
	Labels  map[string]string
	Backend *Backend
	Edge    *edge.Edge
	handler http.Handler
	token   string
	dead    atomic.Bool

	mu     sync.Mutex
	load   api.NodeLoad
	cached map[string]bool // layer digests

	beforeList, afterList atomic.Pointer[func()]
}

// OnNextList makes the node's next answer to a list of its sandboxes
// call before (if set) before the list is taken and after (if set) once
// it is taken and before it is sent: tests hold a reconcile there.
func (n *Node) OnNextList(before, after func()) {
	if before != nil {
		n.beforeList.Store(&before)
	}
	if after != nil {
		n.afterList.Store(&after)
	}
}

// SetLoad sets what the node reports as its load from now on (nothing,
// by default: the host's own load says nothing of a simulated node).
func (n *Node) SetLoad(l api.NodeLoad) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.load = l
}

// CacheLayers makes the node hold layers in its cache (and report them
// in its heartbeats), as a node that ran them before would: tests that
// are not about layer affinity start every node alike.
func (n *Node) CacheLayers(digests ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, d := range digests {
		n.cached[d] = true
	}
}

// Addr is the node's edge address: only Cluster.NewClient reaches it.
func (n *Node) Addr() string { return "http://sim-" + n.ID }

// Token is the token the node's edge takes from the control plane.
func (n *Node) Token() string { return n.token }

// Kill makes the node stop answering, as a crashed host would: calls to
// it fail to connect, and Cluster.Heartbeats skips it.
func (n *Node) Kill() { n.dead.Store(true) }

// Cluster is a set of simulated nodes.
type Cluster struct {
	mu    sync.Mutex
	nodes map[string]*Node // by host
}

// NewCluster returns an empty cluster.
func NewCluster() *Cluster { return &Cluster{nodes: map[string]*Node{}} }

// Add makes a simulated node with the given capacity and labels.
func (c *Cluster) Add(ctx context.Context, id string, capacity api.Resources, labels map[string]string) (*Node, error) {
	b := &Backend{}
	n := &Node{ID: id, Labels: labels, Backend: b, token: "sim-token-" + id, cached: map[string]bool{}}
	e, err := edge.New(ctx, edge.Config{NodeID: id, Backends: []backend.Backend{b}, Layers: layers{n}, Capacity: capacity,
		Load: func(context.Context) api.NodeLoad {
			n.mu.Lock()
			defer n.mu.Unlock()
			return n.load
		}})
	if err != nil {
		return nil, err
	}
	n.Edge = e
	n.handler = e.Handler(n.token)
	c.mu.Lock()
	c.nodes["sim-"+id] = n
	c.mu.Unlock()
	return n, nil
}

// Nodes lists the nodes.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, n)
	}
	return out
}

// NewClient is a server.Config.NewNodeClient: simulated nodes are reached
// in-process, anything else over the network.
func (c *Cluster) NewClient(addr, token string) (*edge.Client, error) {
	host := strings.TrimPrefix(addr, "http://")
	c.mu.Lock()
	n, ok := c.nodes[host]
	c.mu.Unlock()
	if !ok {
		return edge.NewClient(addr, token)
	}
	return edge.NewClientTransport(addr, token, transport{n})
}

// Heartbeat sends one heartbeat of every live node to cp.
func (c *Cluster) Heartbeat(ctx context.Context, cp edge.ControlPlane) error {
	var first error
	for _, n := range c.Nodes() {
		if n.dead.Load() {
			continue
		}
		hb := n.Edge.Heartbeat(ctx, edge.JoinConfig{Addr: n.Addr(), Token: n.token, Labels: n.Labels}, false)
		if _, err := cp.Heartbeat(ctx, hb); err != nil && first == nil {
			first = fmt.Errorf("heartbeat of %s: %w", n.ID, err)
		}
	}
	return first
}

// transport serves requests with a node's edge handler, in memory.
type transport struct{ n *Node }

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.n.dead.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	w := &response{header: http.Header{}, status: http.StatusOK}
	list := req.Method == http.MethodGet && req.URL.Path == "/v1/sandboxes"
	if f := t.n.beforeList.Load(); list && f != nil && t.n.beforeList.CompareAndSwap(f, nil) {
		(*f)()
	}
	t.n.handler.ServeHTTP(w, req)
	if f := t.n.afterList.Load(); list && f != nil && t.n.afterList.CompareAndSwap(f, nil) {
		(*f)()
	}
	if req.Body != nil {
		req.Body.Close()
	}
	return &http.Response{
		StatusCode: w.status, Status: http.StatusText(w.status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.header, Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Request: req,
	}, nil
}

// response is a minimal in-memory http.ResponseWriter.
type response struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (r *response) Header() http.Header { return r.header }

func (r *response) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
}

func (r *response) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}
