package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
)

// Backends a sandbox can run on.
const (
	BackendContainer = "container"
	BackendFnCall    = "fncall"
	BackendMicroVM   = "microvm"
	BackendFullVM    = "fullvm"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateFailed   = "failed"
	StateDeleted  = "deleted"
	StateLost     = "lost" // its node stopped answering
)

// Network modes.
const (
	NetworkNone      = "none"
	NetworkAllowlist = "allowlist"
	NetworkOpen      = "open"
)

// Layer kinds, from the bottom of the stack to the top.
const (
	KindBase      = "base"
	KindWorkspace = "workspace"
	KindToolkit   = "toolkit"
	KindSnapshot  = "snapshot" // made by pack_diff
)

// Encodings of stdout/stderr in exec results.
const (
	EncodingUTF8   = ""       // the default: the strings are the bytes
	EncodingBase64 = "base64" // the bytes were not valid UTF-8
)

// LayerRefs names the layers of a sandbox's root filesystem. Each is a ref:
// "name:tag" or "sha256:<hex digest>". Workspace and toolkit are optional.
type LayerRefs struct {
	Base      string `json:"base"`
	Workspace string `json:"workspace,omitempty"`
	Toolkit   string `json:"toolkit,omitempty"`
}

// Resources a sandbox asks for. Zero means the server's default.
type Resources struct {
	CPU      float64 `json:"cpu,omitempty"`       // cores; may be fractional
	MemoryMB int64   `json:"memory_mb,omitempty"` // hard limit
	DiskMB   int64   `json:"disk_mb,omitempty"`   // writable layer size
	Pids     int64   `json:"pids,omitempty"`      // process limit
}

// Network is a sandbox's network policy. In JSON it is an object
// {"mode": "allowlist", "allow": [...]} or just the mode as a string.
type Network struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow,omitempty"` // CIDRs or host:port
}

// UnmarshalJSON accepts both the object form and a bare mode string.
func (n *Network) UnmarshalJSON(b []byte) error {
	var mode string
	if err := json.Unmarshal(b, &mode); err == nil {
		*n = Network{Mode: mode}
		return nil
	}
	type plain Network
	var p plain
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("network: want a mode string or {\"mode\", \"allow\"}: %w", err)
	}
	*n = Network(p)
	return nil
}

// CreateSandboxRequest is the body of POST /v1/sandboxes and the spec of a
// batch create.
type CreateSandboxRequest struct {
	Backend    string            `json:"backend,omitempty"`
	Layers     *LayerRefs        `json:"layers,omitempty"`
	Snapshot   string            `json:"snapshot,omitempty"`
	Resources  Resources         `json:"resources,omitzero"`
	Network    *Network          `json:"network,omitempty"`
	Phases     map[string]Phase  `json:"phases,omitempty"`
	Profile    string            `json:"profile,omitempty"`
	Phase      string            `json:"phase,omitempty"` // the phase it starts in
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Env        map[string]string `json:"env,omitempty"`

	// IdleTimeoutSeconds destroys the sandbox after this long without
	// activity; 0 means the server's default (by default: none).
	IdleTimeoutSeconds int64 `json:"idle_timeout_seconds,omitempty"`

	// Burst allows the sandbox to run on a cloud burst node (a node in
	// the "burst" pool), which the scheduler uses only while the rest of
	// the cluster is above its utilisation threshold.
	Burst bool `json:"burst,omitempty"`

	// AdmissionTimeoutSeconds bounds how long the create waits in the
	// admission queue when the nodes with room for it are busy (see
	// Admission); 0 means DefaultAdmissionTimeout, -1 not to wait.
	AdmissionTimeoutSeconds int64 `json:"admission_timeout_seconds,omitempty"`
}

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID        string            `json:"id"`
	Backend   string            `json:"backend"`
	State     string            `json:"state"`
	Node      string            `json:"node,omitempty"`
	Layers    LayerRefs         `json:"layers"`
	Snapshot  string            `json:"snapshot,omitempty"`
	Resources Resources         `json:"resources"`
	Network   Network           `json:"network"`
	Phases    map[string]Phase  `json:"phases,omitempty"`
	Profile   string            `json:"profile,omitempty"`
	Phase     string            `json:"phase,omitempty"` // the current phase
	Labels    map[string]string `json:"labels,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Error     string            `json:"error,omitempty"` // why it failed or was reaped
	Burst     bool              `json:"burst,omitempty"` // may run on a burst node
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`

	// The lease: it ends at ExpiresAt, which is created_at + TTLSeconds
	// and, after a renew, the renew's time + its ttl (TTLSeconds if none).
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// IdleTimeoutSeconds, if set, destroys the sandbox after that long
	// without activity (API calls on it, not processes running inside).
	IdleTimeoutSeconds int64 `json:"idle_timeout_seconds,omitempty"`
	// LastActiveAt is the last activity the server knows of.
	LastActiveAt *time.Time `json:"last_active_at,omitempty"`
	// Display is the size of the sandbox's screen, if it has one (a
	// running fullvm sandbox), on GET /v1/sandboxes/{id}.
	Display *Display `json:"display,omitempty"`
}

// RenewRequest is the body of POST /v1/sandboxes/{id}/renew. The lease
// then ends TTLSeconds from now (0: the sandbox's own ttl_seconds).
type RenewRequest struct {
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// SandboxList is one page of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes     []Sandbox `json:"sandboxes"`
	NextPageToken string    `json:"next_page_token,omitempty"`
}

// SandboxCounts is the body of GET /v1/sandboxes:count: how many sandbox
// records (deleted ones until they are purged, a day later) the tenant
// has, or with all_tenants=1 (admin) every tenant, by state and backend.
type SandboxCounts struct {
	Total     int64            `json:"total"`
	ByState   map[string]int64 `json:"by_state"`
	ByBackend map[string]int64 `json:"by_backend"`
	// Groups are the counts by state and backend together.
	Groups []SandboxCountGroup `json:"groups"`
}

// SandboxCountGroup is the number of sandboxes in one state of one backend.
type SandboxCountGroup struct {
	State   string `json:"state"`
	Backend string `json:"backend"`
	Count   int64  `json:"count"`
}

// Trajectory keys an exec into the trajectory log: step Step of the
// tenant's trajectory ID.
type Trajectory struct {
	ID   string `json:"id"`
	Step int64  `json:"step"`
	// CheckpointEvery, if set, asks for a checkpoint (a pack_diff snapshot
	// of the sandbox) after every step that is a multiple of it, from now
	// on; it is a setting of the trajectory, kept until another step
	// changes it; -1 stops checkpoints. See Checkpoint.
	CheckpointEvery int64 `json:"checkpoint_every,omitempty"`
}

// Trajectory step states.
const (
	StepRunning = "running" // recorded before the command started; no result yet
	StepDone    = "done"    // the result is recorded
)

// TrajectoryStep is one recorded step of a trajectory (without its output).
type TrajectoryStep struct {
	Step int64 `json:"step"`
	// Fingerprint is the SHA-256 of what the command runs: argv (a shell
	// string as /bin/sh -c), env, cwd and stdin.
	Fingerprint string     `json:"fingerprint"`
	Sandbox     string     `json:"sandbox"`
	State       string     `json:"state"`
	ExitCode    *int       `json:"exit_code,omitempty"`
	StartedAt   time.Time  `json:"started_at"`
	RecordedAt  *time.Time `json:"recorded_at,omitempty"`
	// Replays is how many times the done step was replayed (answered from
	// the log, not run again) since it ran; ReplayedAt the last time.
	Replays    int64      `json:"replays"`
	ReplayedAt *time.Time `json:"replayed_at,omitempty"`
}

// TrajectoryLog is the body of GET /v1/trajectories/{id}.
type TrajectoryLog struct {
	ID    string           `json:"id"`
	Steps []TrajectoryStep `json:"steps"`
	// CheckpointEvery is the trajectory's checkpoint interval (0: none).
	CheckpointEvery int64 `json:"checkpoint_every,omitempty"`
	// Checkpoints are the kept checkpoints a restore can start from,
	// oldest first.
	Checkpoints []Checkpoint `json:"checkpoints,omitempty"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Exactly one of
// Cmd and Shell is set.
type ExecRequest struct {
	Cmd            []string          `json:"cmd,omitempty"`
	Shell          string            `json:"shell,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	StdinEncoding  string            `json:"stdin_encoding,omitempty"` // "" or "base64"
	TimeoutMs      int64             `json:"timeout_ms,omitempty"`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty"`
	Trajectory     *Trajectory       `json:"trajectory,omitempty"`
	Background     bool              `json:"background,omitempty"`
	// Tag labels a background process, to find it again in the list.
	Tag string `json:"tag,omitempty"`
	// TTY runs the command on a pseudo-terminal of that size: its output
	// is one merged stream, reported as stdout.
	TTY *TTYSize `json:"tty,omitempty"`
	// StdinOpen keeps a background process's stdin open after Stdin (if
	// any) was written: write to it with POST
	// /v1/sandboxes/{id}/processes/{pid}/stdin and close it with
	// POST …/stdin/close. On a TTY, input goes to the terminal. Without
	// it a background process's stdin is Stdin, then end of file.
	StdinOpen bool `json:"stdin_open,omitempty"`
}

// ExecResult is the outcome of a command. Stdout and Stderr hold the bytes
// as text, or as base64 when Encoding says so (when either stream was not
// valid UTF-8). When the output went over the cap, the head and the tail are
// kept and the bytes dropped in between are counted.
type ExecResult struct {
	ExitCode      int    `json:"exit_code"`
	Signal        string `json:"signal,omitempty"` // e.g. "SIGKILL" when killed by a signal
	Stdout        string `json:"stdout"`
	Stderr        string `json:"stderr"`
	Encoding      string `json:"encoding,omitempty"`
	Truncated     bool   `json:"truncated"`
	StdoutDropped int64  `json:"stdout_dropped,omitempty"`
	StderrDropped int64  `json:"stderr_dropped,omitempty"`
	TimedOut      bool   `json:"timed_out"`
	DurationMs    int64  `json:"duration_ms"`
	Replayed      bool   `json:"replayed"`
	// Process is set for background execs: the handle to read and wait on.
	Process *Process `json:"process,omitempty"`
}

// ExecEvent is one line of a streamed exec (Accept: application/x-ndjson).
// Exactly one field is set; the last event is Exit or Error.
type ExecEvent struct {
	Stdout   *string     `json:"stdout,omitempty"`
	Stderr   *string     `json:"stderr,omitempty"`
	Encoding string      `json:"encoding,omitempty"` // of this chunk
	Exit     *ExecResult `json:"exit,omitempty"`     // Stdout/Stderr empty
	Error    *Error      `json:"error,omitempty"`
}

// Process is a background command inside a sandbox.
type Process struct {
	ID         string      `json:"id"`
	Pid        int         `json:"pid"`
	Running    bool        `json:"running"`
	StartedAt  time.Time   `json:"started_at"`
	ExitedAt   *time.Time  `json:"exited_at,omitempty"`
	Result     *ExecResult `json:"result,omitempty"` // once exited
	OutputSize int64       `json:"output_size"`      // bytes produced so far
	Tag        string      `json:"tag,omitempty"`    // as given to exec
	// StdinOpen is true while the process's stdin takes writes (it was
	// started with stdin_open and its stdin was not closed).
	StdinOpen bool `json:"stdin_open,omitempty"`
}

// FileInfo is one entry of a directory listing (GET files?list=1).
type FileInfo struct {
	Name    string    `json:"name"`
	Type    string    `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"` // of a symlink
}

// FileList is the body of a directory listing.
type FileList struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
}

// Layer is a read-only filesystem layer.
type Layer struct {
	Ref       string    `json:"ref"` // name:tag
	Name      string    `json:"name"`
	Tag       string    `json:"tag"`
	Digest    string    `json:"digest"` // sha256:<hex>
	Kind      string    `json:"kind"`
	Size      int64     `json:"size"`   // bytes of the image
	Public    bool      `json:"public"` // visible to every tenant
	CreatedAt time.Time `json:"created_at"`
	// Parents are the layers a snapshot goes on top of, base first, as
	// digests; a sandbox created from the snapshot stacks them under it.
	Parents []string `json:"parents,omitempty"`
	// Usage is set by GET /v1/layers/{ref}?usage=1.
	Usage *LayerUsage `json:"usage,omitempty"`
}

// LayerUsage is what a layer costs and who uses it (GET
// /v1/layers/{ref}?usage=1), as far as the caller's tenant sees: other
// tenants' private layers and sandboxes are not counted.
type LayerUsage struct {
	// Chunks is the number of distinct chunks of the layer's files, and
	// DedupBytes their uncompressed size: what it holds after dedup
	// within itself.
	Chunks     int   `json:"chunks"`
	DedupBytes int64 `json:"dedup_bytes"`
	// StoredBytes is what those chunks take in the layer store
	// (compressed); left out for a layer of very many chunks.
	StoredBytes *int64 `json:"stored_bytes,omitempty"`
	// SharedChunks of them (SharedBytes uncompressed) are also chunks of
	// other layers: removing this layer would not free them.
	SharedChunks int          `json:"shared_chunks"`
	SharedBytes  int64        `json:"shared_bytes"`
	SharedWith   []LayerShare `json:"shared_with"`
	// Sandboxes are the tenant's live sandboxes running on the layer.
	Sandboxes []string     `json:"sandboxes"`
	Lineage   LayerLineage `json:"lineage"`
	// Truncated says a bound cut a list or the layers compared short.
	Truncated bool `json:"truncated,omitempty"`
}

// LayerShare is another layer holding some of a layer's chunks.
type LayerShare struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	Chunks int    `json:"chunks"`
	Bytes  int64  `json:"bytes"`
}

// LayerLineage is a layer's place among snapshots: the layers it stacks
// on (base first) and the snapshot layers stacked on it, as a tree.
type LayerLineage struct {
	Ancestors   []LayerNode `json:"ancestors,omitempty"`
	Descendants []LayerNode `json:"descendants,omitempty"`
}

// LayerNode is one layer of a lineage; Ref is empty for a layer the
// tenant has no record of.
type LayerNode struct {
	Digest   string      `json:"digest"`
	Ref      string      `json:"ref,omitempty"`
	Kind     string      `json:"kind,omitempty"`
	Children []LayerNode `json:"children,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshot; every
// field is optional.
type SnapshotRequest struct {
	// Name is the snapshot layer's name:tag; "snapshot/<sandbox id>:<time>"
	// by default.
	Name string `json:"name,omitempty"`
}

// LayerList is the body of GET /v1/layers.
type LayerList struct {
	Layers []Layer `json:"layers"`
}

// Tenant owns sandboxes, layers and keys.
type Tenant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// Quota bounds the tenant's live sandboxes; Usage is what they hold.
	Quota *Quota `json:"quota,omitempty"`
	Usage *Usage `json:"usage,omitempty"`
}

// Quota bounds what a tenant's live (creating, running, paused, lost)
// sandboxes may hold in total. Zero or absent fields are unlimited.
type Quota struct {
	Sandboxes int64   `json:"sandboxes,omitempty"`
	CPU       float64 `json:"cpu,omitempty"`
	MemoryMB  int64   `json:"memory_mb,omitempty"`
}

// Usage is what a tenant's live sandboxes hold.
type Usage struct {
	Sandboxes int64   `json:"sandboxes"`
	CPU       float64 `json:"cpu"`
	MemoryMB  int64   `json:"memory_mb"`
}

// CreateTenantRequest is the body of POST /v1/tenants.
type CreateTenantRequest struct {
	Name string `json:"name"`
}

// APIKey describes a key. Secret is only ever returned once, on creation.
type APIKey struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin"`
	Secret    string    `json:"secret,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateKeyRequest is the body of POST /v1/tenants/{id}/keys.
type CreateKeyRequest struct {
	Admin bool `json:"admin,omitempty"`
}

// Node states.
const (
	NodeUp       = "up"
	NodeDown     = "down"     // stopped heartbeating; its sandboxes are lost
	NodeDraining = "draining" // takes no new sandboxes
)

// Node is a machine that runs sandboxes.
type Node struct {
	ID       string    `json:"id"`
	Addr     string    `json:"addr"`
	State    string    `json:"state"` // "up", "down", "draining"
	Capacity Resources `json:"capacity"`
	// Limit is the most that may be allocated: memory as is, CPU times the
	// control plane's overcommit factor.
	Limit Resources `json:"limit"`
	// Allocated is what placed sandboxes asked for.
	Allocated Resources `json:"allocated"`
	Sandboxes int       `json:"sandboxes"`
	// Load is what the node measured at its last heartbeat.
	Load     NodeLoad          `json:"load"`
	Backends []string          `json:"backends"`
	Labels   map[string]string `json:"labels,omitempty"`
	// Pool is the node's pool: "" for the regular nodes, "burst" for cloud
	// burst nodes (label pool=burst).
	Pool         string    `json:"pool,omitempty"`
	CachedLayers int       `json:"cached_layers"`
	LastSeen     time.Time `json:"last_seen"`
	// Busy says its sandboxes' measured CPU is at the scheduler's
	// threshold: it takes no new sandbox until they calm down.
	Busy bool `json:"busy,omitempty"`
}

// NodeLoad is what a node measures of its own use.
type NodeLoad struct {
	CPU             float64 `json:"cpu"`               // cores busy, whole node
	MemoryMB        int64   `json:"memory_mb"`         // memory in use, whole node
	SandboxCPU      float64 `json:"sandbox_cpu"`       // cores busy in sandboxes' cgroups
	SandboxMemoryMB int64   `json:"sandbox_memory_mb"` // memory charged to sandboxes' cgroups
	// DiskUsedMB is what is used of the filesystem holding the sandboxes'
	// writable layers (by anything); 0 when the node reports no disk.
	DiskUsedMB int64 `json:"disk_used_mb,omitempty"`
	// DiskFull says that filesystem's free space is down to the reserve
	// the node keeps (5%, at least 1 GiB): it takes no new sandbox.
	DiskFull bool `json:"disk_full,omitempty"`
	// BlankPool is the node's pool of blank container sandboxes that
	// creates claim; absent when the pool is off.
	BlankPool *BlankPool `json:"blank_pool,omitempty"`
}

// BlankPool describes a node's pool of pre-started blank container
// sandboxes (dsec server --container-pool).
type BlankPool struct {
	// Size is the blank sandboxes ready to claim; Target what the pool
	// refills toward (the eligible creates of the last window, between
	// the pool's minimum and Max).
	Size   int `json:"size"`
	Target int `json:"target"`
	Max    int `json:"max"`
	// Claims counts creates served from the pool; Misses eligible creates
	// that found it empty (or whose claim failed) and started cold.
	Claims uint64 `json:"claims"`
	Misses uint64 `json:"misses"`
}

// NodeList is the body of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
	// Admission is the answering replica's admission queue.
	Admission *Admission `json:"admission,omitempty"`
}

// StdoutBytes returns the stdout bytes, decoding base64 if needed.
func (r *ExecResult) StdoutBytes() ([]byte, error) { return decodeOutput(r.Stdout, r.Encoding) }

// StderrBytes returns the stderr bytes, decoding base64 if needed.
func (r *ExecResult) StderrBytes() ([]byte, error) { return decodeOutput(r.Stderr, r.Encoding) }

// Bytes returns the bytes of a stdout or stderr chunk.
func (e *ExecEvent) Bytes() ([]byte, error) {
	switch {
	case e.Stdout != nil:
		return decodeOutput(*e.Stdout, e.Encoding)
	case e.Stderr != nil:
		return decodeOutput(*e.Stderr, e.Encoding)
	}
	return nil, nil
}

func decodeOutput(s, encoding string) ([]byte, error) {
	if encoding == EncodingBase64 {
		return base64.StdEncoding.DecodeString(s)
	}
	return []byte(s), nil
}

// ProcessList is the body of GET /v1/sandboxes/{id}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// FileWritten is the body of a successful file upload.
type FileWritten struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// TenantList is the body of GET /v1/tenants.
type TenantList struct {
	Tenants []Tenant `json:"tenants"`
}

// KeyList is the body of GET /v1/tenants/{id}/keys.
type KeyList struct {
	Keys []APIKey `json:"keys"`
}
