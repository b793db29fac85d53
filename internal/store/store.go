// Package store defines the control plane's durable state: tenants, API
// keys, layers, sandboxes, nodes, and what is charged to each node and
// tenant. Implementations live in sub-packages (sqlite, the embedded
// default; postgres, for several control-plane replicas) and all run the
// behaviour suite in storetest. The charges are the cluster's authoritative
// reservations: a store must never let a node's allocation pass its limit
// nor a tenant's usage pass its quota, whichever replica asks. A Store must
// never hold sandbox runtime state (that lives on the nodes) and must never
// see a plaintext API key.
package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Store is the control plane's database: every role below, which the
// server (the one consumer of all of them) composes. Other consumers take
// only the role they use. Methods return errors wrapping
// errdefs.ErrNotFound and errdefs.ErrAlreadyExists where those apply.
type Store interface {
	TenantStore
	LayerStore
	SandboxStore
	NodeStore
	TrajectoryStore
	CheckpointStore
	Close() error
}

// TenantStore holds tenants, their API keys and their quotas.
type TenantStore interface {
	CreateTenant(ctx context.Context, t Tenant) error
	GetTenant(ctx context.Context, id string) (Tenant, error)
	ListTenants(ctx context.Context) ([]Tenant, error)

	CreateKey(ctx context.Context, k Key) error
	GetKey(ctx context.Context, id string) (Key, error)
	ListKeys(ctx context.Context, tenant string) ([]Key, error)
	DeleteKey(ctx context.Context, id string) error

	// SetQuota sets a tenant's quota (zero fields: unlimited).
	SetQuota(ctx context.Context, tenant string, q Quota) error
	// Usage reports what a tenant's live sandboxes hold, and its quota.
	Usage(ctx context.Context, tenant string) (Usage, error)
}

// LayerStore holds the layer records (the images live in the blob store).
type LayerStore interface {
	// PutLayer records a layer, replacing the one of the same tenant, name
	// and tag (tags move, digests do not).
	PutLayer(ctx context.Context, l Layer) error
	// GetLayer finds name:tag among the tenant's layers, then among public ones.
	GetLayer(ctx context.Context, tenant, name, tag string) (Layer, error)
	// LayerByDigest finds a layer with that digest the tenant may use.
	LayerByDigest(ctx context.Context, tenant, digest string) (Layer, error)
	// ListLayers lists the tenant's layers and the public ones.
	ListLayers(ctx context.Context, tenant string) ([]Layer, error)

	// DeleteLayer removes the tenant's layer name:tag if it still has
	// digest; removing a missing one succeeds.
	DeleteLayer(ctx context.Context, tenant, name, tag, digest string) error
	// LayerInUse reports whether any layer record of any tenant has
	// digest or stacks on it, or a sandbox not deleted runs on it.
	LayerInUse(ctx context.Context, digest string) (bool, error)
	// UnusedLayers lists, oldest first and at most limit, the layers of
	// any tenant whose name starts with prefix, made before before, that
	// nothing uses: no other record has their digest or stacks on it, and
	// no sandbox not deleted runs on it (the layers dsec makes for its own
	// needs, forks and build steps, once their users are gone).
	UnusedLayers(ctx context.Context, prefix string, before time.Time, limit int) ([]Layer, error)
}

// SandboxStore holds the sandboxes' records. Placing and moving them,
// which charges nodes, is NodeStore's.
type SandboxStore interface {
	// CreateSandbox inserts a record and sets its Version. It charges
	// nothing: sandboxes being placed go through PlaceSandboxes.
	CreateSandbox(ctx context.Context, s *Sandbox) error
	// CreateSandboxes inserts many records in one transaction, all or none,
	// and sets their Versions. Like CreateSandbox it charges nothing.
	CreateSandboxes(ctx context.Context, list []*Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// UpdateSandbox replaces a sandbox's record if its Version is still the
	// stored one, and bumps Version. It fails with ErrNotFound if the
	// record does not exist and ErrConflict if it changed since it was read.
	// An update that sets DeletedAt (failed, deleted) releases, in the same
	// transaction, what the record was charged.
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	// TouchSandbox records that a sandbox was used at t.
	TouchSandbox(ctx context.Context, id string, t time.Time) error
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, string, error)
	// CountSandboxes counts the records of a tenant's sandboxes (of every
	// tenant's for tenant ""), by state and backend, without reading them.
	// A state and backend may come more than once: add them up.
	CountSandboxes(ctx context.Context, tenant string) ([]SandboxCount, error)
	// PurgeSandboxes removes records of sandboxes deleted before t.
	PurgeSandboxes(ctx context.Context, deletedBefore time.Time) (int, error)
}

// NodeStore holds the nodes and what is placed on them: the charges that
// keep a node's allocation within its limit and a tenant within its quota.
type NodeStore interface {
	// UpsertNode records a node or updates its description (address,
	// token, capacity, limit, backends, labels, load, last seen; Layers
	// only when not nil). A new node starts with n.State and n.Drain; an
	// existing node keeps its state, drain flag and allocation, which only
	// SetNodeState, SetNodeDrain and the sandbox methods change.
	UpsertNode(ctx context.Context, n Node) error
	GetNode(ctx context.Context, id string) (Node, error)
	ListNodes(ctx context.Context) ([]Node, error)
	// SetNodeState moves a node to state if it is in one of the states from
	// and, when seenBefore is not zero, was last seen before it. It reports
	// whether it changed the node, so that of several replicas exactly one
	// acts on a transition.
	SetNodeState(ctx context.Context, id string, from []string, state string, seenBefore time.Time) (bool, error)
	// SetNodeDrain sets or clears a node's drain flag: a draining node takes
	// no new sandboxes.
	SetNodeDrain(ctx context.Context, id string, drain bool) error

	// PlaceSandboxes inserts the records of sandboxes being placed and, in
	// the same transaction, charges each one's resources to its node
	// (API.Node) and to its tenant. All or nothing: if a node is unknown,
	// down or draining, or would go over its Limit, or a tenant over its
	// quota, nothing is written and the error is a *PlaceError. It sets
	// each record's Version.
	PlaceSandboxes(ctx context.Context, sbs []*Sandbox) error
	// MoveSandbox moves a charged record to another node (after the first
	// refused to build it): in one transaction the charge leaves the old
	// node and lands on the new one, under the same conditions as
	// PlaceSandboxes, and the record is rewritten with API.Node = node. The
	// record's Version must be current.
	MoveSandbox(ctx context.Context, s *Sandbox, node string) error
	// MarkSandboxesLost sets every creating, running and paused sandbox of
	// a node to lost (bumping their Versions) and returns how many. Lost
	// sandboxes stay charged: their node may come back.
	MarkSandboxesLost(ctx context.Context, node string) (int, error)
}

// TrajectoryStore holds the trajectory log (see Step) and the
// trajectories' settings. Steps are keyed by tenant, trajectory and step
// number. BeginStep and FinishStep are durable when they return: the
// record survives a crash of the process and of the machine.
type TrajectoryStore interface {
	// GetStep reads one step, with its result.
	GetStep(ctx context.Context, tenant, trajectory string, step int64) (Step, error)
	// ListSteps lists a trajectory's steps in order, without their results
	// (Result is nil; ExitCode is set once done).
	ListSteps(ctx context.Context, tenant, trajectory string) ([]Step, error)
	// BeginStep records st as running and drops every step of the
	// trajectory from st.Step on, in one transaction: a step that runs
	// starts a new history from there.
	BeginStep(ctx context.Context, st Step) error
	// FinishStep records the result of the running step st.Attempt. It
	// fails with ErrConflict if the step is no longer that attempt.
	FinishStep(ctx context.Context, st Step) error
	// StepReplayed counts a replay of the done step st (st.Attempt): it
	// does nothing if the step has been run again since.
	StepReplayed(ctx context.Context, st Step, at time.Time) error
	// DeleteSteps removes the trajectory's steps from step from on (all of
	// them for from <= 0) and returns how many went.
	DeleteSteps(ctx context.Context, tenant, trajectory string, from int64) (int, error)
	// PurgeTrajectories removes whole trajectories whose newest step
	// started before t, and returns how many steps went.
	PurgeTrajectories(ctx context.Context, before time.Time) (int, error)
	// MoveSteps records that the done steps of a trajectory up to step
	// upTo now have their effects at to: a sandbox restored from a
	// checkpoint taken after upTo. It returns how many moved.
	MoveSteps(ctx context.Context, tenant, trajectory string, upTo int64, to StepPlace) (int, error)

	// PutTrajectory records a trajectory's settings.
	PutTrajectory(ctx context.Context, t Trajectory) error
	// GetTrajectory reads them; ErrNotFound if none were recorded.
	GetTrajectory(ctx context.Context, tenant, id string) (Trajectory, error)
}

// CheckpointStore holds the trajectories' checkpoints (see Checkpoint).
type CheckpointStore interface {
	// AddCheckpoint records a checkpoint, durably.
	AddCheckpoint(ctx context.Context, c Checkpoint) error
	// ListCheckpoints lists a trajectory's live checkpoints in step
	// order: those not dropped whose step is still recorded, done, as the
	// attempt the checkpoint was taken after.
	ListCheckpoints(ctx context.Context, tenant, trajectory string) ([]Checkpoint, error)
	// DropCheckpoint marks a checkpoint dropped (it no longer lists);
	// dropping a missing one succeeds.
	DropCheckpoint(ctx context.Context, c Checkpoint) error
	// DeadCheckpoints lists up to limit checkpoints of any tenant that are
	// not live — dropped, or whose step was dropped or ran again — for
	// their layers to be collected.
	DeadCheckpoints(ctx context.Context, limit int) ([]Checkpoint, error)
	// DeleteCheckpoint removes a checkpoint's record.
	DeleteCheckpoint(ctx context.Context, c Checkpoint) error
}

// Tenant owns keys, layers and sandboxes.
type Tenant struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// Key is an API key. Only the SHA-256 of its secret is kept.
type Key struct {
	ID         string
	Tenant     string
	SecretHash []byte
	Admin      bool
	CreatedAt  time.Time
}

// Layer is a named, tagged reference to a layer image.
type Layer struct {
	Tenant    string
	Name      string
	Tag       string
	Digest    string
	Kind      string
	Size      int64
	Public    bool
	CreatedAt time.Time
	// Parents are the layers a snapshot layer goes on top of, base first
	// (empty for other kinds).
	Parents []string
}

// Sandbox is the control plane's record of a sandbox. The API view lives in
// Sandbox.API; the rest is what only the control plane needs.
type Sandbox struct {
	API    api.Sandbox
	Tenant string
	// LayerDigests are the resolved layers, bottom (base) first.
	LayerDigests []string
	DeletedAt    *time.Time
	// LastActive is when the sandbox was last used, for idle reaping.
	LastActive time.Time `json:"-"`
	// Version counts updates, for optimistic concurrency.
	Version int64 `json:"-"`
	// Generation counts resets: each one throws the sandbox's state away,
	// so trajectory steps recorded before it no longer describe it.
	Generation int64 `json:",omitempty"`
}

// ErrConflict is returned by UpdateSandbox when the record changed since it
// was read; read it again and retry.
var ErrConflict = fmt.Errorf("record changed concurrently: %w", errdefs.ErrFailedPrecondition)

// SandboxFilter selects sandboxes to list.
// SandboxCount is how many sandbox records have a state and a backend.
type SandboxCount struct {
	State   string
	Backend string
	Count   int64
}

type SandboxFilter struct {
	Tenant string // required unless AllTenants
	// AllTenants lists across tenants (for reconciliation and reaping).
	AllTenants bool
	Node       string
	Backend    string
	// Layer selects sandboxes that run on the layer with this digest
	// (stacked anywhere in them). It reads each candidate's record: keep
	// it to one tenant.
	Layer  string
	States []string
	Labels map[string]string
	// ExpiredBy selects sandboxes whose expiry is at or before it.
	ExpiredBy *time.Time
	// IdleBy selects sandboxes with an idle timeout whose last activity
	// plus that timeout is at or before it.
	IdleBy    *time.Time
	Limit     int
	PageToken string
}

// Node states in the store. Draining is a separate flag (Node.Drain), so
// that a draining node that goes down comes back draining.
const (
	NodeUp   = "up"
	NodeDown = "down"
)

// Node is a machine registered with the control plane.
type Node struct {
	ID   string
	Addr string
	// Token is the bearer token the control plane sends to the node's edge
	// API. Whoever reads the store can drive the nodes.
	Token    string `json:",omitempty"`
	State    string
	Drain    bool
	Capacity api.Resources
	// Limit is the most that may be charged to the node: its memory, its
	// CPU times the overcommit factor, its pids. Zero fields are unlimited
	// except memory, which is always a hard limit.
	Limit api.Resources
	// Allocated and Sandboxes are what the node's charged sandboxes hold;
	// the store maintains them and ignores them in UpsertNode.
	Allocated api.Resources
	Sandboxes int
	Backends  []string
	Labels    map[string]string
	Load      api.NodeLoad
	// Layers are the digests of the layers the node has cached.
	Layers    []string
	LastSeen  time.Time
	CreatedAt time.Time
}

// Step is one step of a trajectory: an exec recorded with the fingerprint
// of what it ran, where it ran, and, once done, its result.
type Step struct {
	Tenant     string
	Trajectory string
	Step       int64
	// Fingerprint identifies the command (see package trajectory).
	Fingerprint string
	// Attempt names the run that owns a running step.
	Attempt string
	// Sandbox and Generation are where the step ran: its effects are in
	// that sandbox until its next reset.
	Sandbox    string
	Generation int64
	State      string // api.StepRunning or api.StepDone
	// Result is the recorded answer (done steps, from GetStep only).
	Result     *api.ExecResult
	ExitCode   *int
	StartedAt  time.Time
	RecordedAt *time.Time
	// Replays counts the times the done step was answered from the log
	// instead of run again; ReplayedAt is the last (nil: never).
	Replays    int64
	ReplayedAt *time.Time
}

// Quota bounds what a tenant's live sandboxes may hold; zero is unlimited.
type Quota struct {
	Sandboxes int64
	CPU       float64
	MemoryMB  int64
}

// Usage is what a tenant's live sandboxes hold, and its quota.
type Usage struct {
	Quota     Quota
	Sandboxes int64
	CPU       float64
	MemoryMB  int64
}

// The reasons a placement is refused; both are resource exhaustion.
var (
	ErrNodeFull      = fmt.Errorf("node cannot take it: %w", errdefs.ErrResourceExhausted)
	ErrQuotaExceeded = errdefs.ErrQuotaExceeded
)

// PlaceError says which node (ErrNodeFull) or tenant (ErrQuotaExceeded)
// refused a placement.
type PlaceError struct {
	Node   string
	Tenant string
	Err    error
}

func (e *PlaceError) Error() string {
	if e.Node != "" {
		return fmt.Sprintf("node %s: %v", e.Node, e.Err)
	}
	return fmt.Sprintf("tenant %s: %v", e.Tenant, e.Err)
}

func (e *PlaceError) Unwrap() error { return e.Err }

// MilliCPU is how stores count CPU: integer millicores, so that sums of
// charges and releases stay exact.
func MilliCPU(cpu float64) int64 { return int64(math.Round(cpu * 1000)) }

// Live reports whether a sandbox in state holds resources on its node.
func Live(state string) bool {
	switch state {
	case api.StateCreating, api.StateRunning, api.StatePaused, api.StateLost:
		return true
	}
	return false
}

// Charge is what sandboxes hold, in the units stores count in.
type Charge struct {
	MilliCPU, MemoryMB, Pids, Sandboxes int64
	// DiskMB is charged to nodes only (tenants have no disk quota).
	DiskMB int64
}

// ChargeOf is one sandbox's charge.
func ChargeOf(r api.Resources) Charge {
	return Charge{MilliCPU: MilliCPU(r.CPU), MemoryMB: r.MemoryMB, Pids: r.Pids, Sandboxes: 1, DiskMB: r.DiskMB}
}

// Add adds o to c.
func (c *Charge) Add(o Charge) {
	c.MilliCPU += o.MilliCPU
	c.MemoryMB += o.MemoryMB
	c.Pids += o.Pids
	c.Sandboxes += o.Sandboxes
	c.DiskMB += o.DiskMB
}
