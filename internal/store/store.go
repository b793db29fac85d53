// Package store defines the control plane's durable state: tenants, API
// keys, layers, sandboxes and nodes. Implementations live in sub-packages
// (sqlite, the embedded default) and all run the behaviour suite in
// storetest. A Store must never hold sandbox runtime state (that lives on
// the nodes) and must never see a plaintext API key.
package store

import (
	"context"
	"fmt"
	"time"

	"github.com/dsec-project/dsec/api"
	"github.com/dsec-project/dsec/internal/errdefs"
)

// Store is the control plane's database. Methods return errors wrapping
// errdefs.ErrNotFound and errdefs.ErrAlreadyExists where those apply.
type Store interface {
	CreateTenant(ctx context.Context, t Tenant) error
	GetTenant(ctx context.Context, id string) (Tenant, error)
	ListTenants(ctx context.Context) ([]Tenant, error)

	CreateKey(ctx context.Context, k Key) error
	GetKey(ctx context.Context, id string) (Key, error)
	ListKeys(ctx context.Context, tenant string) ([]Key, error)
	DeleteKey(ctx context.Context, id string) error

	// PutLayer records a layer, replacing the one of the same tenant, name
	// and tag (tags move, digests do not).
	PutLayer(ctx context.Context, l Layer) error
	// GetLayer finds name:tag among the tenant's layers, then among public ones.
	GetLayer(ctx context.Context, tenant, name, tag string) (Layer, error)
	// LayerByDigest finds a layer with that digest the tenant may use.
	LayerByDigest(ctx context.Context, tenant, digest string) (Layer, error)
	// ListLayers lists the tenant's layers and the public ones.
	ListLayers(ctx context.Context, tenant string) ([]Layer, error)

	// CreateSandbox inserts a record and sets its Version.
	CreateSandbox(ctx context.Context, s *Sandbox) error
	// CreateSandboxes inserts many records in one transaction, all or none,
	// and sets their Versions: the bulk path of a batch create.
	CreateSandboxes(ctx context.Context, list []*Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// UpdateSandbox replaces a sandbox's record if its Version is still the
	// stored one, and bumps Version. It fails with ErrNotFound if the
	// record does not exist and ErrConflict if it changed since it was read.
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	// TouchSandbox records that a sandbox was used at t.
	TouchSandbox(ctx context.Context, id string, t time.Time) error
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, string, error)
	// PurgeSandboxes removes records of sandboxes deleted before t.
	PurgeSandboxes(ctx context.Context, deletedBefore time.Time) (int, error)

	UpsertNode(ctx context.Context, n Node) error
	ListNodes(ctx context.Context) ([]Node, error)

	// The trajectory log (see Step). Steps are keyed by tenant, trajectory
	// and step number. BeginStep and FinishStep are durable when they
	// return: the record survives a crash of the process and of the
	// machine.

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
	// DeleteSteps removes the trajectory's steps from step from on (all of
	// them for from <= 0) and returns how many went.
	DeleteSteps(ctx context.Context, tenant, trajectory string, from int64) (int, error)
	// PurgeTrajectories removes whole trajectories whose newest step
	// started before t, and returns how many steps went.
	PurgeTrajectories(ctx context.Context, before time.Time) (int, error)

	Close() error
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
type SandboxFilter struct {
	Tenant string // required unless AllTenants
	// AllTenants lists across tenants (for reconciliation and reaping).
	AllTenants bool
	Node       string
	States     []string
	Labels     map[string]string
	// ExpiredBy selects sandboxes whose expiry is at or before it.
	ExpiredBy *time.Time
	// IdleBy selects sandboxes with an idle timeout whose last activity
	// plus that timeout is at or before it.
	IdleBy    *time.Time
	Limit     int
	PageToken string
}

// Node is a machine registered with the control plane.
type Node struct {
	ID        string
	Addr      string
	State     string
	Capacity  api.Resources
	Backends  []string
	Labels    map[string]string
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
}
