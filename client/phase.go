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

// Profiles lists the named policy profiles a create may refer to
// (CreateSandboxRequest.Profile): the built-in ones and those the server
// was started with, by name.
func (c *Client) Profiles(ctx context.Context) (map[string]api.Profile, error) {
	var out struct {
		Profiles map[string]api.Profile `json:"profiles"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/profiles", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Profiles, nil
}
