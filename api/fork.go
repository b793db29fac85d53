package api

// MaxForkCount is the most copies one fork may ask for. A fork builds its
// copies with the batch machinery, but every copy holds the parent's
// resources: a fork is a branching step, not a fleet create (use
// POST /v1/sandboxes:batch from a snapshot for that).
const MaxForkCount = 256

// Labels every copy made by a fork carries.
const (
	LabelFork   = "dsec.fork"    // the fork's id
	LabelForkOf = "dsec.fork-of" // the parent sandbox's id
)

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many copies to make, 1 to MaxForkCount.
	Count int `json:"count"`
	// Labels are added to the parent's on every copy.
	Labels map[string]string `json:"labels,omitempty"`
	// Trajectory, if set, forks the parent's trajectory log along: every
	// copy gets a trajectory of its own holding the parent's done steps,
	// so a replay of the shared prefix in a copy answers from the log.
	Trajectory *ForkTrajectoryRequest `json:"trajectory,omitempty"`
	// TTLSeconds is the copies' lease; the parent's when zero.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// ForkTrajectoryRequest names the trajectory to fork and, optionally, the
// copies' trajectory ids (one per copy); by default a copy's id is
// "<id>/<fork id>.<index>".
type ForkTrajectoryRequest struct {
	ID  string   `json:"id"`
	IDs []string `json:"ids,omitempty"`
}

// ForkedTrajectory is a copy's trajectory: ID is the copy's, ForkFrom the
// parent's, Steps how many of the parent's steps it holds.
type ForkedTrajectory struct {
	ID       string `json:"id"`
	ForkFrom string `json:"fork_from"`
	Sandbox  string `json:"sandbox"`
	Steps    int    `json:"steps"`
}

// ForkResult is the answer to a fork: the copies in index order, the
// snapshot layer they start from (shared by all of them) and, when asked,
// their trajectories (index-aligned with Sandboxes).
type ForkResult struct {
	Fork   string `json:"fork"`
	Parent string `json:"parent"`
	// Layer is the snapshot layer of a container's fork; a microVM's fork
	// makes none (its copies have the parent's layers and a copy of its
	// writable disk).
	Layer string `json:"layer,omitempty"`
	// Memory says the copies carry the parent's memory and processes (a
	// microVM's fork); a container's copies carry its files only.
	Memory       bool               `json:"memory,omitempty"`
	Sandboxes    []Sandbox          `json:"sandboxes"`
	Trajectories []ForkedTrajectory `json:"trajectories,omitempty"`
	// PausedMs is how long the parent was frozen; DurationMs the whole
	// fork, until every copy ran.
	PausedMs   int64 `json:"paused_ms"`
	DurationMs int64 `json:"duration_ms"`
}

// PauseRequest is the optional body of POST /v1/sandboxes/{id}/pause.
type PauseRequest struct {
	// Memory is where a paused sandbox's memory stays: PauseMemoryKeep
	// (the default: in RAM, resumed at once) or PauseMemoryDisk (a
	// microVM's RAM and device state are saved to its node's disk and
	// its VMM ends, holding no memory; resume restores it, processes and
	// all, also after an edge restart).
	Memory string `json:"memory,omitempty"`
}

// Values of PauseRequest.Memory.
const (
	PauseMemoryKeep = "ram"
	PauseMemoryDisk = "disk"
)
