package client

import (
	"context"
	"net/http"

	"github.com/dsec-project/dsec/api"
)

// RestoreTrajectory recreates a trajectory's sandbox from its newest
// checkpoint (or the one at req.Step): a new sandbox of the same spec
// starts from the checkpoint's snapshot, and the steps up to the
// checkpoint replay in it. Take checkpoints by setting
// Trajectory.CheckpointEvery on a step's exec.
func (c *Client) RestoreTrajectory(ctx context.Context, req *api.RestoreRequest) (*api.RestoreResult, error) {
	var out api.RestoreResult
	if err := c.do(ctx, http.MethodPost, "/v1/trajectories:restore", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
