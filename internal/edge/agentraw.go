package edge

import (
	"context"
	"io"
	"net/http"
	"net/url"
)

// AgentDo sends a request with a raw body (a file's bytes, say) to a
// sandbox's agent and returns the successful response, whose body the
// caller reads and closes; an error answer comes back as an error of its
// class. The client-compatibility surfaces use it for files and processes.
func (c *Client) AgentDo(ctx context.Context, id, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	return c.agent(ctx, id, method, path, q, body)
}
