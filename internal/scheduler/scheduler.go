// Package scheduler decides which node runs a sandbox. Place and
// PlaceBatch are pure functions over a snapshot of node states; Scheduler
// keeps those states in memory and books what it places, so that
// concurrent creates in one process see each other at once. It must never
// talk to nodes or the database: callers feed it what they learn and
// persist what it decides. Its bookings are a fast local view; the
// authoritative reservation is the store's conditional charge, so a stale
// view costs a retry, never an overcommitted node.
package scheduler

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Node states.
const (
	NodeUp       = api.NodeUp
	NodeDown     = api.NodeDown
	NodeDraining = api.NodeDraining
)

// PoolBurst is the pool of cloud burst nodes (node label pool=burst).
const PoolBurst = "burst"

// Config tunes placement.
type Config struct {
	// CPUOvercommit is how many times a node's cores may be promised to
	// sandboxes. Memory is never overcommitted.
	CPUOvercommit float64
	// MaxCPULoad is the fraction of its cores a node's sandboxes may be
	// measured using and the node still take new sandboxes. (The whole
	// node's CPU use, which includes dsec itself and anything else on the
	// host, only lowers its score.)
	MaxCPULoad float64
	// LayerAffinity is what having all of a sandbox's layers cached is
	// worth against free room (1 = an empty node).
	LayerAffinity float64
	// BurstThreshold is the utilisation of the regular nodes above which
	// sandboxes that allow it go to burst nodes.
	BurstThreshold float64
}

// DefaultConfig is DSec's observation: ~90% of sandboxes use under 5% of
// the CPU they ask for, so CPU is oversubscribed 50× (and checked against
// measured use: a node whose sandboxes keep 90% of its cores busy takes
// nothing new); memory is not oversubscribed. Above 80% utilisation, eligible sandboxes go to burst
// nodes.
var DefaultConfig = Config{CPUOvercommit: 50, MaxCPULoad: 0.9, LayerAffinity: 0.3, BurstThreshold: 0.8}

// spreadWeight is how much a node's share of a batch counts against it:
// at its fair share (batch size / fitting nodes) it loses half an empty
// node's worth of score.
const spreadWeight = 0.5

func (c Config) withDefaults() Config {
	d := DefaultConfig
	if c.CPUOvercommit <= 0 {
		c.CPUOvercommit = d.CPUOvercommit
	}
	if c.MaxCPULoad <= 0 {
		c.MaxCPULoad = d.MaxCPULoad
	}
	if c.LayerAffinity < 0 {
		c.LayerAffinity = 0
	}
	if c.BurstThreshold <= 0 {
		c.BurstThreshold = d.BurstThreshold
	}
	return c
}

// NodeState is what the scheduler knows of a node.
type NodeState struct {
	ID    string
	State string
	// Pool is "" for regular nodes, PoolBurst for cloud burst nodes.
	Pool      string
	Capacity  api.Resources
	Allocated api.Resources
	Sandboxes int
	Backends  []string
	Load      api.NodeLoad
	// Layers are the digests the node has cached.
	Layers map[string]bool
}

// Request is what a sandbox needs.
type Request struct {
	Backend   string
	Resources api.Resources
	// Layers are the sandbox's layer digests, for cache affinity.
	Layers []string
	// Burst allows a burst node.
	Burst bool
	// Exclude lists nodes not to use (they refused this sandbox).
	Exclude []string
}

// Place picks the node for req, or fails with ErrResourceExhausted.
func Place(nodes []NodeState, req Request, cfg Config) (string, error) {
	ids, err := PlaceBatch(nodes, req, 1, cfg)
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// PlaceBatch places count sandboxes of one request, one after the other,
// each seeing the ones before it: nodes fill evenly, cached layers attract
// sandboxes up to a node's fair share of the batch, and past it a node
// loses score with every sandbox it gets, so a batch spreads. It returns
// the chosen node of each sandbox that fits, in order; fewer than count
// when the cluster runs out of room, and ErrResourceExhausted when none
// fit. nodes is not modified.
func PlaceBatch(nodes []NodeState, req Request, count int, cfg Config) ([]string, error) {
	cfg = cfg.withDefaults()
	ns := make([]*NodeState, len(nodes))
	for i := range nodes {
		cp := nodes[i]
		ns[i] = &cp
	}
	return newPlacer(ns, req, count, cfg).run(count)
}

func noRoom(req Request) error {
	return fmt.Errorf("no node has room for a %s sandbox with %g cpu and %d MB: %w",
		req.Backend, req.Resources.CPU, req.Resources.MemoryMB, errdefs.ErrResourceExhausted)
}

// placer picks nodes for the sandboxes of one request.
type placer struct {
	nodes  []*NodeState
	req    Request
	cfg    Config
	share  float64        // fair share of the batch per fitting node
	onNode map[string]int // sandboxes of this batch per node
	// The regular nodes' totals, kept current as the batch books, for
	// the burst threshold.
	capMem, allocMem          int64
	capCPU, allocCPU, usedCPU float64
}

func newPlacer(nodes []*NodeState, req Request, count int, cfg Config) *placer {
	p := &placer{nodes: nodes, req: req, cfg: cfg, share: 1}
	if count > 1 {
		p.onNode = map[string]int{}
		fitting := 0
		for _, n := range nodes {
			if p.eligible(n) {
				fitting++
			}
		}
		p.share = math.Max(1, float64(count)/math.Max(1, float64(fitting)))
	}
	for _, n := range nodes {
		if n.State != NodeUp || n.Pool == PoolBurst {
			continue
		}
		p.capMem += n.Capacity.MemoryMB
		p.allocMem += n.Allocated.MemoryMB
		p.capCPU += n.Capacity.CPU
		p.allocCPU += n.Allocated.CPU
		p.usedCPU += n.Load.CPU
	}
	return p
}

// run places count sandboxes and books them.
func (p *placer) run(count int) ([]string, error) {
	out := make([]string, 0, count)
	for range count {
		n := p.next()
		if n == nil {
			break
		}
		book(n, p.req.Resources, 1)
		if n.Pool != PoolBurst {
			p.allocMem += p.req.Resources.MemoryMB
			p.allocCPU += p.req.Resources.CPU
		}
		out = append(out, n.ID)
	}
	if len(out) == 0 {
		return nil, noRoom(p.req)
	}
	return out, nil
}

// utilisation is Utilisation over the placer's running totals.
func (p *placer) utilisation() float64 {
	return utilisation(p.capMem, p.allocMem, p.capCPU, p.allocCPU, p.usedCPU, p.cfg)
}

func utilisation(capMem, allocMem int64, capCPU, allocCPU, usedCPU float64, cfg Config) float64 {
	if capMem == 0 {
		return 1
	}
	u := float64(allocMem) / float64(capMem)
	if capCPU > 0 {
		u = max(u, allocCPU/(capCPU*cfg.CPUOvercommit), usedCPU/capCPU)
	}
	return u
}

// eligible is everything but room: state, backend, exclusion.
func (p *placer) eligible(n *NodeState) bool {
	return n.State == NodeUp && slices.Contains(n.Backends, p.req.Backend) && !slices.Contains(p.req.Exclude, n.ID)
}

// next picks the best node for one more sandbox: a burst node while burst
// is allowed and one fits, else a regular node.
func (p *placer) next() *NodeState {
	var best, bestBurst *NodeState
	bestScore, bestBurstScore := math.Inf(-1), math.Inf(-1)
	burstOK := p.req.Burst && p.utilisation() >= p.cfg.BurstThreshold
	for _, n := range p.nodes {
		if !p.eligible(n) || !fits(n, p.req.Resources, p.cfg) {
			continue
		}
		sc := p.score(n)
		if n.Pool == PoolBurst {
			if burstOK && sc > bestBurstScore {
				bestBurst, bestBurstScore = n, sc
			}
			continue
		}
		if sc > bestScore {
			best, bestScore = n, sc
		}
	}
	if bestBurst != nil {
		best = bestBurst
	}
	if best != nil && p.onNode != nil {
		p.onNode[best.ID]++
	}
	return best
}

func (p *placer) score(n *NodeState) float64 {
	sc := 1 - allocated(n, p.req.Resources, p.cfg) - busyWeight*busy(n)
	k := float64(p.onNode[n.ID])
	if k < p.share && len(p.req.Layers) > 0 {
		hit := 0
		for _, d := range p.req.Layers {
			if n.Layers[d] {
				hit++
			}
		}
		sc += p.cfg.LayerAffinity * float64(hit) / float64(len(p.req.Layers))
	}
	return sc - spreadWeight*k/p.share
}

// busyWeight is what a node's measured use counts against it, beside
// what is allocated on it.
const busyWeight = 0.5

// allocated is how full a node would be with r added: the higher of its
// memory and CPU allocation.
func allocated(n *NodeState, r api.Resources, cfg Config) float64 {
	c := n.Capacity
	l := float64(n.Allocated.MemoryMB+r.MemoryMB) / float64(max(c.MemoryMB, 1))
	if c.CPU > 0 {
		l = max(l, (n.Allocated.CPU+r.CPU)/(c.CPU*cfg.CPUOvercommit))
	}
	return l
}

// busy is how busy a node measures itself: the higher of its cores busy
// and its sandboxes' memory, against what it offers.
func busy(n *NodeState) float64 {
	c := n.Capacity
	b := float64(n.Load.SandboxMemoryMB) / float64(max(c.MemoryMB, 1))
	if c.CPU > 0 {
		b = max(b, n.Load.CPU/c.CPU)
	}
	return b
}

// fits checks room: memory hard against what is allocated and against
// what the node's sandboxes measurably use; CPU against capacity ×
// overcommit and against what its sandboxes measurably use; pids. (The
// whole host's use is not compared with capacity: a node may offer less
// than it has.)
func fits(n *NodeState, r api.Resources, cfg Config) bool {
	c := n.Capacity
	if n.Allocated.MemoryMB+r.MemoryMB > c.MemoryMB || n.Load.SandboxMemoryMB+r.MemoryMB > c.MemoryMB {
		return false
	}
	if c.Pids > 0 && n.Allocated.Pids+r.Pids > c.Pids {
		return false
	}
	if c.CPU > 0 && n.Load.SandboxCPU >= c.CPU*cfg.MaxCPULoad {
		return false
	}
	return n.Allocated.CPU+r.CPU <= c.CPU*cfg.CPUOvercommit+1e-9
}

// Utilisation is how full the regular (non-burst) nodes that are up are,
// together: the highest of allocated memory, allocated CPU against
// capacity × overcommit, and measured CPU, each summed over the nodes. No
// regular node up counts as full.
func Utilisation(nodes []*NodeState, cfg Config) float64 {
	cfg = cfg.withDefaults()
	var capMem, allocMem int64
	var capCPU, allocCPU, usedCPU float64
	for _, n := range nodes {
		if n.State != NodeUp || n.Pool == PoolBurst {
			continue
		}
		capMem += n.Capacity.MemoryMB
		allocMem += n.Allocated.MemoryMB
		capCPU += n.Capacity.CPU
		allocCPU += n.Allocated.CPU
		usedCPU += n.Load.CPU
	}
	return utilisation(capMem, allocMem, capCPU, allocCPU, usedCPU, cfg)
}

// book adds (sign 1) or removes (-1) one sandbox's resources.
func book(n *NodeState, r api.Resources, sign int) {
	f := float64(sign)
	n.Allocated.CPU += f * r.CPU
	n.Allocated.MemoryMB += int64(sign) * r.MemoryMB
	n.Allocated.DiskMB += int64(sign) * r.DiskMB
	n.Allocated.Pids += int64(sign) * r.Pids
	n.Sandboxes += sign
}

// Scheduler holds node states and books what it places on them.
type Scheduler struct {
	cfg Config

	mu    sync.Mutex
	nodes []*NodeState // sorted by ID: ties go to the first
}

// New returns an empty scheduler.
func New(cfg Config) *Scheduler {
	return &Scheduler{cfg: cfg.withDefaults()}
}

// Config is the scheduler's configuration, defaults filled in.
func (s *Scheduler) Config() Config { return s.cfg }

// Preconditions: s.mu is held.
func (s *Scheduler) find(id string) (*NodeState, int) {
	i, ok := slices.BinarySearchFunc(s.nodes, id, func(n *NodeState, id string) int { return strings.Compare(n.ID, id) })
	if !ok {
		return nil, i
	}
	return s.nodes[i], i
}

// SetNode adds a node or updates all it knows of it, allocation included
// (as the store counts it: the authoritative figure).
func (s *Scheduler) SetNode(n NodeState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := n
	if cur, i := s.find(n.ID); cur != nil {
		s.nodes[i] = &cp
	} else {
		s.nodes = slices.Insert(s.nodes, i, &cp)
	}
}

// UpdateNode is SetNode keeping what this scheduler has booked on a node
// it knows: for a heartbeat, whose allocation figure may predate bookings
// in flight (the periodic SetNode from the store catches up).
func (s *Scheduler) UpdateNode(n NodeState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := n
	if cur, i := s.find(n.ID); cur != nil {
		cp.Allocated, cp.Sandboxes = cur.Allocated, cur.Sandboxes
		s.nodes[i] = &cp
	} else {
		s.nodes = slices.Insert(s.nodes, i, &cp)
	}
}

// RemoveNode forgets a node.
func (s *Scheduler) RemoveNode(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, i := s.find(id); cur != nil {
		s.nodes = slices.Delete(s.nodes, i, i+1)
	}
}

// SetState changes a node's state only.
func (s *Scheduler) SetState(id, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, _ := s.find(id); n != nil {
		n.State = state
	}
}

// Reserve places req and books its resources on the chosen node.
func (s *Scheduler) Reserve(req Request) (string, error) {
	ids, err := s.ReserveBatch(req, 1)
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// ReserveBatch places count sandboxes of req (see PlaceBatch) and books
// them.
func (s *Scheduler) ReserveBatch(req Request, count int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return newPlacer(s.nodes, req, count, s.cfg).run(count)
}

// Charge books resources on a node without placement (a sandbox the store
// charged elsewhere, or moved here).
func (s *Scheduler) Charge(node string, r api.Resources) { s.add(node, r, 1) }

// Release returns a sandbox's resources to its node.
func (s *Scheduler) Release(node string, r api.Resources) { s.add(node, r, -1) }

func (s *Scheduler) add(node string, r api.Resources, sign int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, _ := s.find(node); n != nil {
		book(n, r, sign)
	}
}

// Utilisation is the regular nodes' utilisation (see Utilisation).
func (s *Scheduler) Utilisation() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Utilisation(s.nodes, s.cfg)
}

// Nodes returns a snapshot of every node's state, by ID.
func (s *Scheduler) Nodes() []NodeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]NodeState, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, *n)
	}
	return out
}
