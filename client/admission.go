package client

import (
	"context"
	"net/http"

	"github.com/dsec-project/dsec/api"
)

// NodeList reads the nodes with the answering replica's admission queue
// (admin only): creates that wait because the nodes with room for them
// are busy. CreateSandbox waits with them; it has no timeout of its own,
// so a ctx deadline should leave room for the create's
// admission_timeout_seconds (api.DefaultAdmissionTimeout if unset) plus
// the build.
func (c *Client) NodeList(ctx context.Context) (*api.NodeList, error) {
	var out api.NodeList
	if err := c.do(ctx, http.MethodGet, "/v1/nodes", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
