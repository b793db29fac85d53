// Package edge is the node agent: it builds sandboxes with a backend from
// layer images it fetches by digest, keeps track of them, reaches their
// in-sandbox agents, and serves all of that over the edge HTTP API that the
// control plane calls (see Handler and Client). On start it recovers the
// sandboxes its backends left on the node. The edge must never decide
// placement, tenancy or lifetimes: the control plane does, and tells it.
package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/agent"
	"github.com/dsec-project/dsec/internal/backend"
	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/reqid"
)

// Layers makes layers available on this node, fetching what they need.
type Layers interface {
	// Fetch returns the files of the layer with the digest on this node:
	// the image to mount and, for a chunked layer, its data device.
	Fetch(ctx context.Context, digest string) (backend.Layer, error)
}

// SnapshotResult is the layer a snapshot made.
type SnapshotResult struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// FrozenMs is how long the sandbox was frozen.
	FrozenMs int64 `json:"frozen_ms,omitempty"`
}

// SnapshotRequest is the body of the edge's POST /v1/sandboxes/{id}/snapshot.
type SnapshotRequest struct {
	// Merge is how many of the sandbox's top layers to flatten into the
	// snapshot with its changes (0: the changes alone).
	Merge int `json:"merge"`
	// Aside copies the changes aside while the sandbox is frozen and packs
	// the copy after the thaw (a fork: the sandbox goes on at once), when
	// the node takes snapshots.
	Aside bool `json:"aside,omitempty"`
}

// Config configures an edge.
type Config struct {
	// NodeID names this node to the control plane.
	NodeID   string
	Backends []backend.Backend
	Layers   Layers
	// Packer stores snapshots in the shared store (usually Layers
	// itself); nil means this node takes none.
	Packer *StoreLayers
	// Capacity is what this node offers; zero fields are measured
	// (DiskMB only with DiskDir).
	Capacity api.Resources
	// DiskDir is a directory on the filesystem that holds the sandboxes'
	// writable layers: its size less a reserve is the node's disk
	// capacity unless Capacity.DiskMB is set, its use is reported in
	// heartbeats, and a create is refused once it is used up to the
	// capacity. Empty, the node reports no disk and is not limited by it.
	DiskDir string
	// Load measures the node's load for heartbeats; by default /proc and
	// the backends' cgroups.
	Load   func(ctx context.Context) api.NodeLoad
	Logger *slog.Logger
}

// Edge manages the sandboxes of one node.
type Edge struct {
	cfg      Config
	backends map[string]backend.Backend
	log      *slog.Logger

	load loadMeter

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	// layersUsed are the layers sandboxes used lately, with when;
	// layersGen counts changes and sentLayersGen is the generation the
	// last heartbeat carried.
	layersUsed               map[string]time.Time
	layersGen, sentLayersGen uint64
}

// sandbox is the edge's handle on one sandbox.
type sandbox struct {
	spec    backend.Spec
	backend backend.Backend
	agent   *agent.Client

	// op serializes lifecycle operations (reset, pause, destroy) on it.
	op sync.Mutex

	// screen is its screen's size as last asked (displaySize).
	screen displayCache
}

// CreateRequest is the body of the edge's POST /v1/sandboxes.
type CreateRequest struct {
	ID      string `json:"id"`
	Backend string `json:"backend"`
	// Layers are digests, base first.
	Layers    []string      `json:"layers"`
	Resources api.Resources `json:"resources"`
	// Network and Files are the policy of Phase.
	Network      api.Network       `json:"network"`
	Files        api.FileRules     `json:"files,omitzero"`
	NeedsNetwork bool              `json:"needs_network,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	Phase        string            `json:"phase,omitempty"`
}

// PhaseRequest is the body of the edge's PUT /v1/sandboxes/{id}/phase.
type PhaseRequest = backend.Policy

// Status is a sandbox as the edge sees it.
type Status struct {
	ID      string `json:"id"`
	Backend string `json:"backend"`
	State   string `json:"state"`
}

// NodeInfo describes the node.
type NodeInfo struct {
	ID        string        `json:"id"`
	Capacity  api.Resources `json:"capacity"`
	Backends  []string      `json:"backends"`
	Sandboxes int           `json:"sandboxes"`
}

// New creates an edge and recovers the sandboxes its backends already run.
func New(ctx context.Context, cfg Config) (*Edge, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = reqid.Logger(cfg.Logger)
	e := &Edge{
		cfg:        cfg,
		backends:   map[string]backend.Backend{},
		log:        cfg.Logger.With("node", cfg.NodeID),
		sandboxes:  map[string]*sandbox{},
		layersUsed: map[string]time.Time{},
		layersGen:  1,
	}
	for _, b := range cfg.Backends {
		e.backends[b.Name()] = b
	}
	if e.cfg.Capacity.CPU == 0 {
		e.cfg.Capacity.CPU = float64(runtime.NumCPU())
	}
	if e.cfg.Capacity.MemoryMB == 0 {
		e.cfg.Capacity.MemoryMB = allocatableMemoryMB()
	}
	if e.cfg.Capacity.DiskMB == 0 && e.cfg.DiskDir != "" {
		d, err := diskCapacityMB(e.cfg.DiskDir)
		if err != nil {
			return nil, err
		}
		e.cfg.Capacity.DiskMB = d
	}
	for _, b := range cfg.Backends {
		specs, err := b.Recover(ctx)
		if err != nil {
			return nil, fmt.Errorf("recover %s sandboxes: %w", b.Name(), err)
		}
		for _, s := range specs {
			e.sandboxes[s.ID] = e.newSandbox(s, b)
			for _, l := range s.Layers {
				e.layersUsed[l.Digest] = time.Now()
			}
		}
		if len(specs) > 0 {
			e.log.InfoContext(ctx, "recovered sandboxes", "backend", b.Name(), "count", len(specs))
		}
	}
	return e, nil
}

func (e *Edge) newSandbox(spec backend.Spec, b backend.Backend) *sandbox {
	sb := &sandbox{spec: spec, backend: b}
	sb.agent = agent.NewClient(func(ctx context.Context) (net.Conn, error) { return e.dialAgent(ctx, sb) })
	return sb
}

// repairTimeout bounds a repair that a connection to a dead agent starts.
const repairTimeout = 2 * time.Minute

// dialAgent connects to a sandbox's agent. If nothing listens on its
// socket any more (the agent was killed, and with it the container whose
// init it is) and the backend is a backend.Repairer, the sandbox is
// repaired under its lifecycle lock and dialed once more. While the lock
// is held (a repair another request started, or a reset, snapshot,
// destroy) the dial fails at once, errdefs.ErrUnavailable: a 503 to retry.
func (e *Edge) dialAgent(ctx context.Context, sb *sandbox) (net.Conn, error) {
	id := sb.spec.ID
	c, err := sb.backend.Dial(ctx, id)
	if err == nil || !(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)) {
		return c, err
	}
	r, ok := sb.backend.(backend.Repairer)
	if !ok {
		return nil, err
	}
	if !sb.op.TryLock() {
		return nil, fmt.Errorf("%w (the sandbox is being repaired or changed; retry): %w", err, errdefs.ErrUnavailable)
	}
	defer sb.op.Unlock()
	// A client that gives up must not cut a restart short.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), repairTimeout)
	defer cancel()
	repaired, rerr := r.Repair(rctx, id)
	if errors.Is(rerr, errdefs.ErrNotFound) {
		return nil, err // destroyed meanwhile
	}
	if rerr != nil {
		e.log.ErrorContext(ctx, "repair of a sandbox whose agent is gone failed", "sandbox", id, "err", rerr)
		return nil, fmt.Errorf("%w (repair failed: %v)", err, rerr)
	}
	if repaired {
		e.log.WarnContext(ctx, "restarted a sandbox whose agent was gone; its files are kept, its processes lost", "sandbox", id)
	}
	return sb.backend.Dial(ctx, id)
}

// Info describes the node.
func (e *Edge) Info() NodeInfo {
	e.mu.Lock()
	n := len(e.sandboxes)
	e.mu.Unlock()
	return NodeInfo{
		ID:        e.cfg.NodeID,
		Capacity:  e.cfg.Capacity,
		Backends:  slices.Sorted(maps.Keys(e.backends)),
		Sandboxes: n,
	}
}

// Create builds a sandbox.
func (e *Edge) Create(ctx context.Context, req CreateRequest) (Status, error) {
	b, ok := e.backends[req.Backend]
	if !ok {
		return Status{}, errdefs.Invalid("backend %q is not offered by node %s", req.Backend, e.cfg.NodeID)
	}
	if err := e.checkDisk(); err != nil {
		return Status{}, err
	}
	spec := backend.Spec{
		ID: req.ID, Backend: req.Backend, Resources: req.Resources,
		Network: req.Network, Files: req.Files, NeedsNetwork: req.NeedsNetwork, Env: req.Env, Phase: req.Phase,
	}
	for _, d := range req.Layers {
		l, err := e.cfg.Layers.Fetch(ctx, d)
		if err != nil {
			return Status{}, fmt.Errorf("fetch layer %s: %w", d, err)
		}
		spec.Layers = append(spec.Layers, l)
		e.noteLayer(l.Digest)
	}
	sb := e.newSandbox(spec, b)
	sb.op.Lock()
	defer sb.op.Unlock()
	e.mu.Lock()
	if _, dup := e.sandboxes[req.ID]; dup {
		e.mu.Unlock()
		return Status{}, fmt.Errorf("sandbox %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	e.sandboxes[req.ID] = sb
	e.mu.Unlock()

	if err := b.Create(ctx, spec); err != nil {
		e.mu.Lock()
		delete(e.sandboxes, req.ID)
		e.mu.Unlock()
		return Status{}, err
	}
	e.log.DebugContext(ctx, "created sandbox", "sandbox", req.ID, "backend", req.Backend)
	return Status{ID: req.ID, Backend: req.Backend, State: api.StateRunning}, nil
}

func (e *Edge) get(id string) (*sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, ok := e.sandboxes[id]
	if !ok {
		return nil, errdefs.NotFound("sandbox %s", id)
	}
	return sb, nil
}

// Get reports a sandbox's state.
func (e *Edge) Get(ctx context.Context, id string) (Status, error) {
	sb, err := e.get(id)
	if err != nil {
		return Status{}, err
	}
	st, err := sb.backend.State(ctx, id)
	if err != nil {
		return Status{}, err
	}
	return Status{ID: id, Backend: sb.spec.Backend, State: st}, nil
}

// List reports every sandbox on the node (without asking the backends).
func (e *Edge) List() []Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Status, 0, len(e.sandboxes))
	for id, sb := range e.sandboxes {
		out = append(out, Status{ID: id, Backend: sb.spec.Backend, State: api.StateRunning})
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Destroy removes a sandbox. Destroying an unknown sandbox succeeds.
func (e *Edge) Destroy(ctx context.Context, id string) error {
	sb, err := e.get(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	sb.agent.Close()
	if err := sb.backend.Destroy(ctx, id); err != nil {
		return err
	}
	e.mu.Lock()
	if e.sandboxes[id] == sb {
		delete(e.sandboxes, id)
	}
	e.mu.Unlock()
	return nil
}

// Reset brings a sandbox back to the clean state of its layers.
func (e *Edge) Reset(ctx context.Context, id string) error {
	return e.lifecycle(ctx, id, func(sb *sandbox) error {
		sb.agent.Close() // connections to the old agent are dead
		defer sb.screen.forget()
		return sb.backend.Reset(ctx, id)
	})
}

// Snapshot packs a sandbox's changes (and its top req.Merge layers) into
// a new layer. The sandbox is frozen meanwhile and runs on afterwards;
// with req.Aside it is frozen only while its changes are copied aside.
func (e *Edge) Snapshot(ctx context.Context, id string, req SnapshotRequest) (SnapshotResult, error) {
	if e.cfg.Packer == nil {
		return SnapshotResult{}, fmt.Errorf("node %s takes no snapshots: %w", e.cfg.NodeID, errdefs.ErrFailedPrecondition)
	}
	aside := req.Aside
	var res SnapshotResult
	var copied string
	var frozen time.Duration
	err := e.lifecycle(ctx, id, func(sb *sandbox) error {
		if ds, ok := sb.backend.(backend.DiskSnapshotter); ok {
			return ds.SnapshotDisk(ctx, id, func(ctx context.Context, path string) error {
				var err error
				res, err = e.cfg.Packer.PackDisk(ctx, path)
				return err
			})
		}
		start := time.Now()
		defer func() { frozen = time.Since(start) }()
		return sb.backend.Snapshot(ctx, id, req.Merge, func(ctx context.Context, dirs []string) error {
			var err error
			if aside {
				copied, err = e.cfg.Packer.CopyAside(ctx, dirs)
				return err
			}
			res, err = e.cfg.Packer.Pack(ctx, dirs)
			return err
		})
	})
	if copied != "" {
		defer os.RemoveAll(copied)
	}
	if err == nil && copied != "" {
		res, err = e.cfg.Packer.Pack(ctx, []string{copied})
	}
	if err != nil {
		return SnapshotResult{}, err
	}
	res.FrozenMs = frozen.Milliseconds()
	e.log.InfoContext(ctx, "snapshot", "sandbox", id, "layer", res.Digest, "size", res.Size, "merged", req.Merge,
		"frozen", frozen, "aside", aside)
	return res, nil
}

// Pause freezes a sandbox.
func (e *Edge) Pause(ctx context.Context, id string) error {
	return e.lifecycle(ctx, id, func(sb *sandbox) error { return sb.backend.Pause(ctx, id) })
}

// Resume thaws a sandbox.
func (e *Edge) Resume(ctx context.Context, id string) error {
	return e.lifecycle(ctx, id, func(sb *sandbox) error { return sb.backend.Resume(ctx, id) })
}

func (e *Edge) lifecycle(ctx context.Context, id string, op func(*sandbox) error) error {
	sb, err := e.get(id)
	if err != nil {
		return err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	return op(sb)
}

// Agent returns the client of a sandbox's agent.
func (e *Edge) Agent(id string) (*agent.Client, error) {
	sb, err := e.get(id)
	if err != nil {
		return nil, err
	}
	return sb.agent, nil
}

// SetPhase switches a sandbox to another policy phase, in place.
func (e *Edge) SetPhase(ctx context.Context, id string, p PhaseRequest) error {
	return e.lifecycle(ctx, id, func(sb *sandbox) error {
		ph, ok := sb.backend.(backend.Phaser)
		if !ok {
			return errdefs.Invalid("backend %s cannot switch policy phases", sb.backend.Name())
		}
		if err := ph.SetPhase(ctx, id, p); err != nil {
			return err
		}
		sb.spec.Phase, sb.spec.Network, sb.spec.Files = p.Phase, p.Network, p.Files
		return nil
	})
}
