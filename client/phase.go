package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/dsec-project/dsec/api"
)

// SetPhase switches a sandbox to another of its policy phases. When it
// returns, every command started afterwards runs under the new phase.
func (c *Client) SetPhase(ctx context.Context, id, phase string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.do(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/phase", nil, &api.SetPhaseRequest{Phase: phase}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
