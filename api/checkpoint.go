package api

import "time"

// Checkpoint is a snapshot of a trajectory's sandbox taken right after a
// step: its effects, and those of every step before it that ran in that
// sandbox, are in the snapshot layer. A sandbox restored from it replays
// those steps from the log.
type Checkpoint struct {
	// Step is the step after which the snapshot was taken.
	Step int64 `json:"step"`
	// Snapshot is the snapshot layer's ref (name:tag); Digest its digest.
	Snapshot string `json:"snapshot"`
	Digest   string `json:"digest"`
	Size     int64  `json:"size"`
	// Sandbox and Generation are where it was taken.
	Sandbox    string    `json:"sandbox"`
	Generation int64     `json:"generation"`
	CreatedAt  time.Time `json:"created_at"`
}

// RestoreRequest is the body of POST /v1/trajectories:restore.
type RestoreRequest struct {
	// Trajectory is the trajectory whose sandbox is recreated.
	Trajectory string `json:"trajectory"`
	// Step picks a kept checkpoint by its step; 0 takes the newest.
	Step int64 `json:"step,omitempty"`
	// TTLSeconds overrides the lease of the new sandbox (0: the one the
	// checkpointed sandbox was created with).
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// RestoreResult is the answer of POST /v1/trajectories:restore: the new
// sandbox and the checkpoint it was made from. Steps up to
// Checkpoint.Step replay in it; later ones run.
type RestoreResult struct {
	Sandbox    Sandbox    `json:"sandbox"`
	Checkpoint Checkpoint `json:"checkpoint"`
}
