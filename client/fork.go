package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/dsec-project/dsec/api"
)

// Fork makes req.Count copies of a sandbox's state now: each copy holds
// the parent's filesystem as it was at the call (a container's processes
// are not carried), and the parent goes on. With req.Trajectory each copy
// also gets a trajectory holding the parent's steps, which replay there.
// A fork is all or nothing.
func (c *Client) Fork(ctx context.Context, id string, req *api.ForkRequest) (*api.ForkResult, error) {
	var out api.ForkResult
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/fork", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Hibernate pauses a microVM with its memory on its node's disk: its
// VMM ends and holds no RAM; Resume restores it, processes and all.
func (c *Client) Hibernate(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	req := &api.PauseRequest{Memory: api.PauseMemoryDisk}
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/pause", nil, req, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
