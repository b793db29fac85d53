package store

import "time"

// Trajectory holds a trajectory's settings. Its steps are Steps.
type Trajectory struct {
	Tenant string
	ID     string
	// CheckpointEvery asks for a checkpoint after every step that is a
	// multiple of it (0: none).
	CheckpointEvery int64
	UpdatedAt       time.Time
}

// StepPlace is where a step's effects are: a sandbox in one generation.
type StepPlace struct {
	Sandbox    string
	Generation int64
}

// Checkpoint is a snapshot layer of a trajectory's sandbox taken right
// after step Step (as attempt Attempt) ran there. It is live while that
// step is still recorded as that attempt: a step that runs again at or
// before it starts another history, which the snapshot does not show.
type Checkpoint struct {
	Tenant     string
	Trajectory string
	Step       int64
	Attempt    string
	// The snapshot layer: the tenant's LayerName:LayerTag, with Digest.
	LayerName, LayerTag string
	Digest              string
	Size                int64
	// Sandbox and Generation are where it was taken.
	Sandbox    string
	Generation int64
	// Spec is the create request (JSON, without layers) that recreates
	// the sandbox around the snapshot.
	Spec      []byte
	CreatedAt time.Time
	Dropped   bool
}
