// Package backend defines what a node needs from a sandbox runtime: create
// a sandbox from layer images, reach its agent, reset, pause, destroy, and
// find its sandboxes again after a restart. Implementations live in
// sub-packages (container: runc; microvm: a VM per sandbox) and all pass the behaviour
// suite in backendtest. A backend must never touch the control plane's
// state, and must leave nothing behind (mount, cgroup, process, socket,
// directory) when a create fails half-way or a sandbox is destroyed.
package backend

import (
	"context"
	"net"

	"github.com/dsec-project/dsec/api"
)

// Backend runs sandboxes of one kind on this node. All methods are safe for
// concurrent use on different sandboxes; the caller serializes operations
// on one sandbox.
type Backend interface {
	// Name is the api.Backend* value this backend serves.
	Name() string
	// Create builds and starts a sandbox. When it returns nil the agent
	// accepts connections. On error nothing of the sandbox is left.
	Create(ctx context.Context, spec Spec) error
	// Destroy stops the sandbox and removes everything of it. It is
	// idempotent: destroying an unknown sandbox succeeds.
	Destroy(ctx context.Context, id string) error
	// Reset kills every process and discards every change, bringing the
	// sandbox back to the clean state of its layers, in place.
	Reset(ctx context.Context, id string) error
	// Pause freezes every process of the sandbox; Resume thaws them.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Snapshot freezes the sandbox and calls pack with the directories
	// that hold its changes, in overlayfs format (whiteouts are 0/0
	// character devices, opaque directories carry trusted.overlay.opaque):
	// first its writable layer, then, for flattening, its top merge
	// read-only layers, top first. The sandbox is thawed when pack returns
	// (a paused sandbox stays paused). pack must only read the
	// directories.
	Snapshot(ctx context.Context, id string, merge int, pack func(ctx context.Context, dirs []string) error) error
	// Dial opens a connection to the sandbox's agent.
	Dial(ctx context.Context, id string) (net.Conn, error)
	// State reports the sandbox's runtime state: api.StateRunning,
	// api.StatePaused, or api.StateFailed if its init died.
	State(ctx context.Context, id string) (string, error)
	// Recover finds the sandboxes this backend left on the node (after an
	// edge restart), repairs what it can (restarting a sandbox whose init
	// died, over its kept writable layer), cleans up what was half made,
	// and returns the specs of the sandboxes that are usable.
	Recover(ctx context.Context) ([]Spec, error)
}

// Spec is everything a backend needs to build a sandbox.
type Spec struct {
	ID      string `json:"id"`
	Backend string `json:"backend"`
	// Layers are the read-only layers, bottom (base) first.
	Layers    []Layer       `json:"layers"`
	Resources api.Resources `json:"resources"`
	// Network and Files are the policy of the current Phase.
	Network api.Network       `json:"network"`
	Files   api.FileRules     `json:"files,omitzero"`
	Env     map[string]string `json:"env,omitempty"`
	Phase   string            `json:"phase,omitempty"`
	// NeedsNetwork says some phase may reach beyond the sandbox: it gets
	// a network interface even while its current phase has none.
	NeedsNetwork bool `json:"needs_network,omitempty"`
}

// Policy is what a sandbox enforces in one phase.
type Policy struct {
	Phase   string        `json:"phase"`
	Network api.Network   `json:"network"`
	Files   api.FileRules `json:"files"`
}

// Phaser is implemented by backends that switch a running sandbox to
// another policy phase without restarting it: when SetPhase returns, every
// command started afterwards runs under p.
type Phaser interface {
	SetPhase(ctx context.Context, id string, p Policy) error
}

// Repairer is implemented by backends that can restart, in place, a
// sandbox whose agent is gone (the container backend: the agent is the
// container's init, so killing it stops the container). Repair restarts
// the sandbox over its kept files, as Recover does, if its agent
// certainly cannot be reached, and reports whether it did; its processes
// are lost. The caller serializes it with the sandbox's other operations.
type Repairer interface {
	Repair(ctx context.Context, id string) (bool, error)
}

// Layer is one read-only layer available on this node: what files make it
// up. A backend mounts Path as EROFS, adding device=Device when Device is
// set (a chunked layer: Path is its metadata image, Device its data blob);
// a VM backend attaches them as disks in the same roles.
type Layer struct {
	Digest string `json:"digest"`
	// Path is the EROFS image file on this node.
	Path string `json:"path"`
	// Device is the file holding the layer's data, if separate: a blobfs
	// file (read on demand) or a complete copy on node disk.
	Device string `json:"device,omitempty"`
	// OnDemand says Device is a blobfs file, best read with direct I/O.
	OnDemand bool `json:"on_demand,omitempty"`
	// Dir says Path is a directory holding the layer's tree, used as it
	// is and never shared (`dsec bench image`'s untar baseline).
	Dir bool `json:"dir,omitempty"`
}

// Usage is what a backend's sandboxes use together.
type Usage struct {
	// CPUSeconds is the CPU time they have used, cumulative (a counter:
	// the caller takes rates).
	CPUSeconds float64
	// MemoryBytes is the memory charged to them now.
	MemoryBytes int64
}

// UsageReporter is implemented by backends that can measure what their
// sandboxes use together (the container backend reads its cgroup parent).
type UsageReporter interface {
	Usage(ctx context.Context) (Usage, error)
}

// DiskSnapshotter is implemented by backends whose sandboxes are whole
// disks (fullvm): a snapshot is a standalone disk image, stored as a new
// vm layer, instead of a directory of changes. pack reads the image at
// path, which is removed when SnapshotDisk returns.
type DiskSnapshotter interface {
	SnapshotDisk(ctx context.Context, id string, pack func(ctx context.Context, path string) error) error
}

// Display is implemented by backends whose sandboxes may have a screen
// (fullvm). A sandbox without one is errdefs.ErrInvalid.
type Display interface {
	// Screenshot returns the screen as PNG, and its size.
	Screenshot(ctx context.Context, id string) ([]byte, api.Display, error)
	// Input performs the actions in order (screen.Compile checks them)
	// and returns the screen's size.
	Input(ctx context.Context, id string, actions []api.InputAction) (api.Display, error)
	// DialVNC connects to the screen's VNC (RFB) server.
	DialVNC(ctx context.Context, id string) (net.Conn, error)
}

// Hibernator is implemented by backends that can pause a sandbox with its
// memory on node disk (microvm): the sandbox's process ends and holds no
// RAM; Resume restores it, its processes where they were. A hibernated
// sandbox stays so across an edge restart.
type Hibernator interface {
	Hibernate(ctx context.Context, id string) error
}

// Forker is implemented by backends whose fork carries memory and
// processes (microvm): Fork makes a sandbox for each id in copies, each
// starting from the parent's memory, processes and writable disk at the
// moment of the call, with an identity of its own (host name, machine
// id, random seed). The parent goes on as it was (running or paused). It
// is all or nothing: on error no copy is left. It returns the copies'
// specs, in order.
type Forker interface {
	Fork(ctx context.Context, id string, copies []string) ([]Spec, error)
}
