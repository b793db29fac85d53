package edge

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/dsec-project/dsec/internal/errdefs"
	"github.com/dsec-project/dsec/internal/httpapi"
)

// AgentJSON sends a request to a sandbox's agent at path (e.g. "/exec",
// "/procs/p-1/wait"), with a JSON body in (if not nil), and decodes the
// JSON answer into out (if not nil). It is how the control plane runs
// commands it must see the result of, such as trajectory steps.
func (c *Client) AgentJSON(ctx context.Context, id, method, path string, q url.Values, in, out any) error {
	body, err := httpapi.JSONBody(in)
	if err != nil {
		return err
	}
	resp, err := c.agent(ctx, id, method, path, q, body)
	if err != nil {
		return err
	}
	if err := httpapi.ReadJSON(resp.Body, out); err != nil {
		return fmt.Errorf("agent %s %s: decode: %w: %w", method, path, err, errdefs.ErrUnavailable)
	}
	return nil
}

// AgentGet sends a GET to a sandbox's agent and returns the successful
// response, whose body the caller reads (raw process output) and closes.
func (c *Client) AgentGet(ctx context.Context, id, path string, q url.Values) (*http.Response, error) {
	return c.agent(ctx, id, http.MethodGet, path, q, nil)
}

func (c *Client) agent(ctx context.Context, id, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	u := c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/agent" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("agent %s %s: %w", method, path, ctx.Err())
		}
		return nil, fmt.Errorf("agent %s %s: %w: %w", method, path, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, httpapi.ReadError(resp)
	}
	return resp, nil
}
